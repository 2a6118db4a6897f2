"""b's two layouts: which device's implementation reads b column-major, and the float64 and
double-backward formula, which gives b its gradient in b's own layout. Here day87_fast
departs from the lesson's contract (fast/tests/test_wheel.py states how).

nn.Linear keeps its weight W as (out, in) and computes x @ W.t(). W.t() is a (K, N) view
with strides (1, K): b column-major. The lesson refuses it (rule 'contiguous'), so a layer
that passes it would copy its whole weight at every call. day87_fast takes b row-major
(strides (N, 1)) or column-major (strides (1, K)) where its implementation reads both:
- the CPU reference (fast/csrc/binding.cpp's wmmaMmCpu): torch's matmul reads either in
  place, through BLAS's transpose flag;
- not CUDA yet: the kernels' column-major path waits for a GPU run's proof, and until then
  binding.cpp refuses a column-major b there, saying what the CPU takes.
"""

import torch

from . import lesson_copy

# The device types whose implementation of wmma_mm and wmma_mm_bias reads a column-major b.
READS_COLUMN_MAJOR_B = frozenset({"cpu"})


def reads_column_major_b(device):
    """Whether the operators take b column-major on `device` (a torch.device)."""
    return device.type in READS_COLUMN_MAJOR_B


def column_major_only(matrix):
    """Whether `matrix` is column-major and not also row-major (a vector is both)."""
    return not matrix.is_contiguous() and matrix.transpose(0, 1).is_contiguous()


def setup_context(ctx, inputs, output):
    """The lesson's setup_context (lesson_copy.py) for a and b, the first two inputs, and
    b's layout: the formula gives b's gradient in it, and b itself is saved only where a
    wants a gradient."""
    lesson_copy.setup_context(ctx, inputs[:2], output)
    ctx.b_column_major = column_major_only(inputs[1])


def backward_formula(ctx, grad):
    """op.py's formula, with b's gradient in b's layout.

    Autograd takes a gradient of any strides: it checks only the shape, dtype and device
    (validate_outputs in torch/csrc/autograd/engine.cpp). But where the input is a view of a
    parameter, as weight.t() is, AccumulateGrad stores the parameter's .grad in the
    parameter's own strides (the Gradient Layout Contract,
    torch/csrc/autograd/functions/accumulate_grad.h): a gradient in any other layout is
    copied into one that is, at every step that starts with .grad None (zero_grad's
    default). weight.t()'s gradient, transposed back to weight's shape, has weight's
    row-major layout only if it came out column-major.
    """
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
    if ctx.needs_input_grad[1] and ctx.b_column_major:
        # The same product transposed: grad^T @ a is b's gradient's transpose, N x K and
        # row-major; transposed back (a view), it is K x N and column-major, as b is.
        wide_a = a.to(grad.dtype)
        grad_b = torch.matmul(grad.transpose(0, 1), wide_a).to(a.dtype).transpose(0, 1)
    elif ctx.needs_input_grad[1]:
        wide_a = a.transpose(0, 1).to(grad.dtype)
        grad_b = torch.matmul(wide_a, grad).to(a.dtype)
    return grad_a, grad_b
