"""bench.py: wmma_mm beside cuBLAS, and what a build and an import cost.

    python checks/bench.py                 # TFLOP/s table and per-call host overhead (needs a GPU)
    python checks/bench.py --build-times   # cold build and warm import, in fresh processes

Method (for --bench): fresh random inputs, never zeros; a warm-up pass first;
enough input sets to rotate through that they cannot all sit in L2, so every call
reads its operands from memory; each figure is the median of 15 timings with CUDA
events, each timing a back-to-back run of calls, divided by the number of calls.
The baseline is cuBLAS under the same precision contract: FP16 in, FP32
accumulate, FP32 out (torch.mm with out_dtype=torch.float32).
"""

import contextlib
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import op  # noqa: E402

SIZES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 2048),
         (4096, 4096, 4096), (8192, 8192, 8192), (8192, 4096, 1024)]
TIMINGS = 15


def baseline():
    """cuBLAS at wmma_mm's precision contract, and what to call it in the table."""
    probe = torch.ones(16, 16, dtype=torch.half, device="cuda")
    try:
        torch.mm(probe, probe, out_dtype=torch.float32)
        return (lambda a, b: torch.mm(a, b, out_dtype=torch.float32)), "torch.mm(out_dtype=f32)"
    except TypeError:  # out_dtype arrived around torch 2.8
        return (lambda a, b: (a @ b).float()), "(a @ b).float(): FP16 out, no out_dtype here"


def input_sets(m, n, k, requires_grad=False):
    """Enough (a, b) pairs that together they are twice the L2, at most 64 of them."""
    l2_bytes = torch.cuda.get_device_properties(0).L2_cache_size
    per_set = 2 * (m * k + k * n)
    count = min(64, max(1, math.ceil(2 * l2_bytes / per_set)))
    return [(torch.randn(m, k, device="cuda", dtype=torch.half, requires_grad=requires_grad),
             torch.randn(k, n, device="cuda", dtype=torch.half, requires_grad=requires_grad))
            for _ in range(count)]


def milliseconds_per_call(function, sets, target_ms=20.0):
    for a, b in sets:  # warm-up: module load, cuBLAS heuristics, the caching allocator
        function(a, b)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for a, b in sets:
        function(a, b)
    end.record()
    end.synchronize()
    calls = max(len(sets), int(target_ms / max(start.elapsed_time(end) / len(sets), 1e-3)))
    timings = []
    for _ in range(TIMINGS):
        start.record()
        for call in range(calls):
            function(*sets[call % len(sets)])
        end.record()
        end.synchronize()
        timings.append(start.elapsed_time(end) / calls)
    return statistics.median(timings)


def host_microseconds_per_call(function, a, b, calls=2000):
    """Wall time per call at a size where the GPU finishes first: the host's cost."""
    for _ in range(50):
        function(a, b)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        function(a, b)
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return 1e6 * elapsed / calls


def bench():
    if not torch.cuda.is_available() or not op.BUILD["with_cuda"]:
        print("bench.py needs a GPU and the extension's CUDA part; nothing to measure here.")
        return
    base, base_name = baseline()
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"baseline {base_name}")
    print(f"{'M':>6}{'N':>6}{'K':>6}{'wmma_mm TFLOP/s':>17}{'cuBLAS TFLOP/s':>16}{'ratio':>7}"
          f"{'wmma_mm us':>12}{'cuBLAS us':>11}")
    for m, n, k in SIZES:
        sets = input_sets(m, n, k)
        ours = milliseconds_per_call(op.wmma_mm, sets)
        theirs = milliseconds_per_call(base, sets)
        flops = 2.0 * m * n * k
        print(f"{m:>6}{n:>6}{k:>6}{flops / ours / 1e9:>17.1f}{flops / theirs / 1e9:>16.1f}"
              f"{theirs / ours:>7.2f}{1e3 * ours:>12.1f}{1e3 * theirs:>11.1f}", flush=True)
        del sets
    print()
    print("host overhead at 128^3, microseconds of wall time per call")
    print(f"{'inputs':<22}{'wmma_mm':>10}{base_name:>28}")
    for requires_grad in (False, True):
        (a, b), = input_sets(128, 128, 128, requires_grad)[:1]
        ours = host_microseconds_per_call(op.wmma_mm, a, b)
        theirs = host_microseconds_per_call(base, a, b)
        label = "requires_grad=True" if requires_grad else "plain tensors"
        print(f"{label:<22}{ours:>10.1f}{theirs:>28.1f}")
    print()
    training_step()


@contextlib.contextmanager
def lessons_backward():
    """op.py's backward as the lesson wrote it (FP32 matmuls), for comparison only."""
    op._FP16_PRODUCTS_TO_FP32 = False
    try:
        yield
    finally:
        op._FP16_PRODUCTS_TO_FP32 = True


def training_step():
    """One layer's forward and backward, x (M x K) @ w (K x N), the op beside the
    fp16 path that autocast takes (FP16 in and out, backward on an FP16 grad), and
    the op with the lesson's FP32 backward; then the backward's accuracy."""
    print("forward + backward, milliseconds per step (gradients from torch.autograd.grad)")
    print(f"{'M':>6}{'K':>6}{'N':>6}{'fp16 x @ w':>12}{'wmma_mm':>10}{'ratio':>7}"
          f"{'wmma_mm, lesson FP32 backward':>31}")
    for m, k, n in ((8192, 4096, 4096), (256, 384, 512)):
        sets = input_sets(m, n, k, requires_grad=True)
        grad32, grad16 = torch.randn(m, n, device="cuda"), torch.randn(m, n, device="cuda").half()

        def fp16_path(x, w):
            return torch.autograd.grad(x @ w, (x, w), grad16)

        def with_op(x, w):
            return torch.autograd.grad(op.wmma_mm(x, w), (x, w), grad32)

        base = milliseconds_per_call(fp16_path, sets)
        ours = milliseconds_per_call(with_op, sets)
        with lessons_backward():
            lesson = milliseconds_per_call(with_op, sets)
        print(f"{m:>6}{k:>6}{n:>6}{base:>12.3f}{ours:>10.3f}{ours / base:>7.2f}{lesson:>31.3f}", flush=True)
        del sets
    print()
    m, k, n = 2048, 1024, 1536
    print(f"backward accuracy at {m}x{k}x{n}: ||grad_a - float64|| / ||float64||")
    print(f"{'gradients':<14}{'wmma_mm':>10}{'fp16 path':>11}{'lesson FP32':>13}")
    for regime in ("randn", "1e-7..1e-5"):
        x = torch.randn(m, k, device="cuda").half().requires_grad_()
        w = torch.randn(k, n, device="cuda").half().requires_grad_()
        grad = torch.randn(m, n, device="cuda")
        if regime != "randn":
            grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
        reference = grad.double() @ w.double().t()
        errors = [torch.autograd.grad(op.wmma_mm(x, w), x, grad)[0], torch.autograd.grad(x @ w, x, grad.half())[0]]
        with lessons_backward():
            errors.append(torch.autograd.grad(op.wmma_mm(x, w), x, grad)[0])
        errors = [((e.double() - reference).norm() / reference.norm()).item() for e in errors]
        print(f"{regime:<14}{errors[0]:>10.2e}{errors[1]:>11.2e}{errors[2]:>13.2e}")


def build_times():
    """Cold build (a fresh cache, this machine's architecture only) and warm import
    (import op minus import torch, median of 5 fresh processes)."""
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with tempfile.TemporaryDirectory(prefix="day87-cold-") as cache:
        environment = dict(os.environ, TORCH_EXTENSIONS_DIR=cache)
        if op.BUILD["with_cuda"]:
            environment["TORCH_CUDA_ARCH_LIST"] = op.architecture_list()
        start = time.perf_counter()
        subprocess.run([sys.executable, "-c", "import op"], cwd=here, env=environment, check=True)
        cold = time.perf_counter() - start
        probe = ("import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
                 "import op; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)")
        samples = [subprocess.run([sys.executable, "-c", probe], cwd=here, env=environment, check=True,
                                  capture_output=True, text=True).stdout.split() for _ in range(5)]
    torch_import = statistics.median(float(s[0]) for s in samples)
    op_import = statistics.median(float(s[1]) for s in samples)
    what = f"architectures {op.BUILD['archs']}" if op.BUILD["with_cuda"] else "CPU part only"
    print(f"cold build ({what}): {cold:.1f} s")
    print(f"warm import: import torch {torch_import:.3f} s, then import op {op_import:.3f} s")


def main():
    if sys.argv[1:] == ["--build-times"]:
        build_times()
    elif sys.argv[1:] == []:
        bench()
    else:
        print(__doc__)
        sys.exit(2)


if __name__ == "__main__":
    main()
