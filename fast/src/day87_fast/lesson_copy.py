"""What day87_fast shares with the lesson's op.py, copied once: the Python side of the
contract (its rules and messages, in the fake's words), the tile, setup_context and the
float64 and double-backward formula.

Copied, not imported: the installed package stands alone, with no lesson folder beside it.
fast/tests/test_wheel.py holds each copy to the lesson's op.py: the same messages for the
same bad inputs, the same gradients.
"""

import torch

# The tile the CUDA kernel needs M, N and K to divide (op.py's TILE_M, TILE_N, TILE_K).
TILE_M, TILE_N, TILE_K = 128, 128, 16


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
        for size, tile in ((a.shape[0], TILE_M), (b.shape[1], TILE_N), (a.shape[1], TILE_K)):
            torch._check(size % tile == 0, lambda: (
                f"{op_name}: rule 'tile': M, N and K must be multiples of {TILE_M}, "
                f"{TILE_N} and {TILE_K}; got M={a.shape[0]}, N={b.shape[1]}, K={a.shape[1]}"))


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


def backward_formula(ctx, grad):
    # c[i][j] = sum_p a[i][p] b[p][j], so dL/da = grad @ b^T and dL/db = a^T @ grad:
    # two library matmuls in the accumulate dtype, each rounded back to its input's dtype.
    # Differentiable itself, so it also serves a second derivative.
    a, b = ctx.saved_tensors
    grad_a, grad_b = None, None
    if ctx.needs_input_grad[0]:
        # a may be None here (saved only when b wants a gradient: setup_context);
        # b is not, and the contract gives it a's dtype, the one grad_a must have.
        wide_b = b.transpose(0, 1).to(grad.dtype)
        grad_a = torch.matmul(grad, wide_b).to(b.dtype)
    if ctx.needs_input_grad[1]:
        wide_a = a.transpose(0, 1).to(grad.dtype)
        grad_b = torch.matmul(wide_a, grad).to(a.dtype)
    return grad_a, grad_b
