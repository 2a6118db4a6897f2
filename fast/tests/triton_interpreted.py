"""triton_interpreted.py: bench/triton_peer.py's kernel run in Triton's interpreter, on
the CPU, for tests/test_triton_peer.py, which runs it in a process of its own:

    cd fast && TRITON_INTERPRET=1 python -m tests.triton_interpreted OUTPUT.pt

Each kernel (the shipped one, and a copy of triton_peer.py per planted bug) at each
autotuning configuration, plain and fused, at each shape, in each layout (a planted one
row-major alone): the operands and the outputs are saved to OUTPUT.pt, for the test to
grade against float64.
"""

import importlib.util
import pathlib
import sys
import tempfile

import torch
import triton

PEER = pathlib.Path(__file__).resolve().parent.parent / "bench" / "triton_peer.py"

# (M, N, K). 72 rows are ragged for both tile heights (64, 128); 96 columns for the tile
# widths 64, 128 and 256; 48 of K for both depths (32, 64). 600 rows make 10 rows of
# 64-row tiles: a whole group of 8 rows and a last, shorter one of 2. Then no rows (no
# program runs), and K = 0 (c is the bias, or zero).
SHAPES = [(72, 96, 48), (600, 40, 24), (0, 40, 24), (5, 40, 0)]
LAYOUTS = ["row-major", "b column-major", "a and b column-major"]

# Each planted bug: the text in triton_peer.py, and what it becomes in its copy.
PLANTED = {
    "the bias added twice": ("accumulator += bias[None, :]", "accumulator += 2 * bias[None, :]"),
    "the last, partial step of K dropped": ("range(0, tl.cdiv(K, BLOCK_K))",
                                            "range(0, K // BLOCK_K)"),
    "FP16 accumulation": ("tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)",
                          "tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float16)"),
    "the last group of tile rows taken as full": ("min(tile_rows - first_row, GROUP_ROWS)",
                                                  "GROUP_ROWS"),
}


def planted_source(bug):
    """triton_peer.py's text with the bug's edit, which must apply exactly once."""
    text, replacement = PLANTED[bug]
    source = PEER.read_text()
    if source.count(text) != 1:
        raise ValueError(f"planted bug {bug!r}: {text!r} is in triton_peer.py "
                         f"{source.count(text)} times, not once")
    return source.replace(text, replacement)


def imported(path, name):
    """The module at path, under name: triton.jit reads each kernel's source from its file."""
    specification = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(specification)
    sys.modules[name] = module
    specification.loader.exec_module(module)
    return module


def operands(m, n, k, layout):
    """(a, b, bias), seeded by shape and layout: a (M x K), b (K x N) FP16, bias (N) FP32;
    a column-major matrix is the transpose of a row-major one, as nn.Linear's weight.t()."""
    torch.manual_seed(m * n * k + LAYOUTS.index(layout))
    a = (torch.randn(k, m).t() if layout == "a and b column-major" else torch.randn(m, k)).half()
    b = (torch.randn(n, k).t() if layout != "row-major" else torch.randn(k, n)).half()
    return a, b, torch.randn(n)


def run(output):
    if not triton.knobs.runtime.interpret:
        raise SystemExit("tests.triton_interpreted runs under TRITON_INTERPRET=1 only")
    with tempfile.TemporaryDirectory(prefix="triton-peer-planted-") as folder:
        kernels = {"shipped": imported(PEER, "triton_peer_shipped")}
        for index, bug in enumerate(PLANTED):
            path = pathlib.Path(folder) / f"triton_peer_planted_{index}.py"
            path.write_text(planted_source(bug))
            kernels[bug] = imported(path, path.stem)
        inputs = {(shape, layout): operands(*shape, layout)
                  for shape in SHAPES for layout in LAYOUTS}
        outputs = {}
        for kernel, module in kernels.items():
            for index, config in enumerate(module.CONFIGS):
                # One configuration at a time: the autotuner runs a lone one without
                # timing it (it cannot time on the CPU), so each is run and checked.
                module.gemm_kernel.configs = [config]
                for (shape, layout), (a, b, bias) in inputs.items():
                    if kernel != "shipped" and layout != "row-major":
                        continue  # each planted bug is in the arithmetic, any layout shows it
                    outputs[kernel, index, shape, layout, "plain"] = module.matmul(a, b)
                    outputs[kernel, index, shape, layout, "fused"] = module.matmul_bias(
                        a, b, bias)
    torch.save({"inputs": inputs, "outputs": outputs}, output)


if __name__ == "__main__":
    run(sys.argv[1])
