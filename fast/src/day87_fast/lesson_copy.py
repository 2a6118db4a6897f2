"""What day87_fast shares with the lesson's op.py, copied once: the Python side of the
contract (its rules and messages, in the fake's words), the tile and setup_context.

Copied, not imported: the installed package stands alone, with no lesson folder beside it.
fast/tests/test_wheel.py holds each copy to the lesson's op.py: the same messages for the
same bad inputs, and states where day87_fast departs (RAGGED_M_ON_CUDA below). The float64
and double-backward formula, which gives a column-major b its gradient in its own layout, is
layouts.py's; test_wheel.py holds its gradients to op.py's.
"""

import torch

# The tile the CUDA kernel needs M, N and K to divide (op.py's TILE_M, TILE_N, TILE_K).
TILE_M, TILE_N, TILE_K = 128, 128, 16

# Where day87_fast departs from op.py: the CUDA refusal of a ragged M says what the CPU
# takes (fast/csrc/binding.cpp's kRaggedMOnCuda, word for word).
RAGGED_M_ON_CUDA = ("the CPU reference takes any M; CUDA will once a GPU run proves its "
                    "kernels' masked tail rows")


def check_tensors(op_name, a, b):  # of None the dispatcher says only "no device"
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{op_name}: rule 'two matrices': {name} must be a 2-D tensor; "
                            f"got {type(value).__name__}")


def input_dtype_on(device):
    """What the operators take and compute in on `device`: FP16 on CUDA, float64 elsewhere
    (the CPU reference)."""
    return torch.float16 if device.type == "cuda" else torch.float64


def accumulate_dtype(input_dtype):
    """FP16 accumulates and is stored in FP32; the float64 reference path stays float64."""
    widened = {torch.float16: torch.float32, torch.float64: torch.float64}
    if input_dtype not in widened:
        raise TypeError(f"day87: no accumulate dtype for {input_dtype}; the operators take "
                        "torch.float16 (CUDA) or torch.float64 (CPU)")
    return widened[input_dtype]


def check_matrices(op_name, a, b):
    """fast/csrc/binding.cpp's rules that a fake tensor can show, in its words: a compiled
    call fails as an eager one does."""
    def broke(rule, requirement):
        return lambda: (f"{op_name}: rule '{rule}': {requirement}; "
                        f"got a: {described(a)}, b: {described(b)}")
    torch._check(a.dim() == 2 and b.dim() == 2, broke("two matrices", "a and b must be 2-D"))
    torch._check(a.device == b.device, broke("one device", "a and b must be on the same device"))
    expected = input_dtype_on(a.device)
    torch._check(a.dtype == expected and b.dtype == expected,
                 broke("dtype", f"on {a.device} a and b must be {scalar_type(expected)}"))
    torch._check(a.shape[1] == b.shape[0],
                 broke("inner dimensions", "a.size(1) must equal b.size(0)"))
    if a.device.type == "cuda":  # one check per size: each becomes a guard of its own
        # M's is first: where M breaks the rule, the message ends with RAGGED_M_ON_CUDA, as
        # the binding's does.
        for size, tile, note in ((a.shape[0], TILE_M, f"; {RAGGED_M_ON_CUDA}"),
                                 (b.shape[1], TILE_N, ""), (a.shape[1], TILE_K, "")):
            torch._check(size % tile == 0, lambda note=note: (
                f"{op_name}: rule 'tile': M, N and K must be multiples of {TILE_M}, "
                f"{TILE_N} and {TILE_K}; got M={a.shape[0]}, N={b.shape[1]}, K={a.shape[1]}"
                f"{note}"))


def described(t):  # "[4, 3] Double on cpu", as binding.cpp writes a tensor's sizes, dtype, device
    return f"[{', '.join(map(str, t.shape))}] {scalar_type(t.dtype)} on {t.device}"


def scalar_type(dtype):  # torch.float16 -> "Half": C++'s name, which PyTorch's own errors use
    return torch.empty((), dtype=dtype, device="meta").type().split(".")[-1][:-len("Tensor")]


def setup_context(ctx, inputs, output):
    a, b = inputs
    # Save each input only when its partner needs a gradient: grad_a needs b and
    # grad_b needs a. No copy is made; autograd keeps a reference.
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None,
                          b if ctx.needs_input_grad[0] else None)
