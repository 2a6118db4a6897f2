"""test_triton_peer.py: bench/triton_peer.py, the Triton peer of bench.py's tables A and
D, on the CPU (no GPU).

    cd fast && python -m pytest -q tests/test_triton_peer.py

- Both kernels, c = a @ b and c = a @ b + bias, run in Triton's interpreter
  (TRITON_INTERPRET=1) at each autotuning configuration, on shapes ragged at every edge,
  a and b row-major and column-major (tests/triton_interpreted.py): each output within
  test_op.py's bound against float64, K * 2^-23 * (|A| @ |B|), and (K + 1) * 2^-23 *
  (|A| @ |B| + |bias|) with the bias.
- Each bug planted in a copy of the kernel (tests/triton_interpreted.py's PLANTED) takes
  some output past that bound.
- Inputs outside the kernel's contract are refused, naming the rule and the values.
The interpreter runs in a process of its own: triton.jit reads TRITON_INTERPRET when it
decorates a kernel, at triton_peer's import, and this process imports triton_peer
compiled, as bench.py does. Skipped where triton is not installed: torch's CPU-only wheels
ship none.
"""

import collections
import os
import pathlib
import subprocess
import sys

import pytest
import torch

from tests import lesson_folder  # noqa: F401  the lesson's folder importable, for test_op
import test_op  # the lesson's bound: error_ratio

pytest.importorskip("triton", reason="triton is not installed (torch's CUDA wheels ship it, "
                    "its CPU-only ones do not)")
from bench import triton_peer  # noqa: E402  as bench.py imports it: compiled, not interpreted
from tests import triton_interpreted  # noqa: E402

FAST = pathlib.Path(__file__).resolve().parent.parent
# Seconds allowed the interpreter's process, which takes about 11 on 2 busy cores.
INTERPRETER_LIMIT_S = 300


@pytest.fixture(scope="module")
def worst_ratios(tmp_path_factory):
    """The worst error_ratio of each kernel's outputs, plain and fused: {(kernel, kind):
    ratio}, over every configuration, shape and layout that it ran."""
    output = tmp_path_factory.mktemp("triton-interpreted") / "runs.pt"
    ran = subprocess.run([sys.executable, "-m", "tests.triton_interpreted", str(output)],
                         cwd=FAST, env=dict(os.environ, TRITON_INTERPRET="1"),
                         capture_output=True, text=True, timeout=INTERPRETER_LIMIT_S)
    assert ran.returncode == 0, ran.stdout + ran.stderr
    runs = torch.load(output)
    worst = collections.defaultdict(float)
    for (kernel, _, shape, layout, kind), c in runs["outputs"].items():
        a, b, bias = runs["inputs"][shape, layout]
        assert c.dtype == torch.float32 and c.shape == (a.shape[0], b.shape[1])
        ratio = test_op.error_ratio(c, a, b, bias if kind == "fused" else None)
        worst[kernel, kind] = max(worst[kernel, kind], ratio)
    return worst


def test_both_kernels_within_the_bound_at_every_configuration(worst_ratios):
    for kind in ("plain", "fused"):
        assert worst_ratios["shipped", kind] <= 1, (kind, worst_ratios["shipped", kind])


@pytest.mark.parametrize("bug", list(triton_interpreted.PLANTED))
def test_each_planted_bug_is_caught(worst_ratios, bug):
    worst = max(worst_ratios[bug, "plain"], worst_ratios[bug, "fused"])
    assert worst > 1, f"planted bug {bug!r} stays within the bound: {worst:.3f}"


def half(*shape, device="cpu"):
    return torch.zeros(*shape, dtype=torch.float16, device=device)


@pytest.mark.parametrize("call, said", [
    (lambda: triton_peer.matmul(half(4, 3).numpy(), half(3, 5)), "rule 'tensors': a must be"),
    (lambda: triton_peer.matmul(half(2, 4, 3), half(3, 5)),
     r"rule 'two matrices'.*a: \(2, 4, 3\) float16"),
    (lambda: triton_peer.matmul_bias(half(4, 3), half(3, 5), torch.zeros(1, 5)),
     r"rule 'two matrices': a and b must be 2-D, bias 1-D; .*bias: \(1, 5\) float32"),
    (lambda: triton_peer.matmul(half(4, 3).float(), half(3, 5)),
     r"rule 'dtype'.*a: \(4, 3\) float32 on cpu, b: \(3, 5\) float16"),
    (lambda: triton_peer.matmul(half(4, 3), half(3, 5).bfloat16()), r"rule 'dtype'.*bfloat16"),
    (lambda: triton_peer.matmul_bias(half(4, 3), half(3, 5), half(5)),
     r"rule 'dtype': a and b must be float16, bias float32.*bias: \(5,\) float16"),
    (lambda: triton_peer.matmul(half(4, 3), half(3, 5, device="meta")),
     r"rule 'one device'.*a: \(4, 3\) float16 on cpu, b: \(3, 5\) float16 on meta"),
    (lambda: triton_peer.matmul(half(4, 3), half(3, 5)),
     r"rule 'CUDA'.*TRITON_INTERPRET=1.*on cpu"),
], ids=["not a tensor", "3-D a", "2-D bias", "float32 a", "bfloat16 b", "float16 bias",
        "two devices", "CPU, compiled"])
def test_refusals_name_the_rule_and_the_values(monkeypatch, call, said):
    monkeypatch.setattr(triton_peer, "INTERPRETED", False)  # as compiled, whatever this shell set
    with pytest.raises((TypeError, ValueError), match=said):
        call()


@pytest.mark.parametrize("call, said", [
    (lambda: triton_peer.matmul(half(4, 3), half(4, 5)),
     r"rule 'inner dimensions'.*a: \(4, 3\).*b: \(4, 5\)"),
    (lambda: triton_peer.matmul_bias(half(4, 3), half(3, 5), torch.zeros(4)),
     r"rule 'inner dimensions'.*bias must have b's columns.*bias: \(4,\) float32"),
    # On meta tensors, which hold no memory: 2^16 x 2^16 elements, the farthest 2^32 - 1.
    (lambda: triton_peer.matmul(half(2**16, 2**16, device="meta"), half(2**16, 8, device="meta")),
     r"rule '32-bit offsets'.*of a.*its farthest is 4294967295 \(shape \(65536, 65536\)"),
], ids=["K differs", "bias of K, not N", "past 32-bit offsets"])
def test_refusals_where_the_device_is_taken(monkeypatch, call, said):
    """The rules checked after the device's: these operands are on the CPU (or meta),
    taken as the interpreter takes them."""
    monkeypatch.setattr(triton_peer, "INTERPRETED", True)
    with pytest.raises(ValueError, match=said):
        call()
