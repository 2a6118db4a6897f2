"""day87_fast: day 88's operator: the exercise (wmma_mm_bias) solved, and the lesson's
wmma_mm made fast. Open it after your own attempt at the exercise.

    pip install torch ninja "setuptools>=70.1"   # first: the build compiles against them
    pip install --no-build-isolation ./fast      # once: builds the wheel's two libraries
    import day87_fast
    c = day87_fast.wmma_mm(a, b)               # the lesson's dtypes; b may be weight.t()
    c = day87_fast.wmma_mm_bias(a, b, bias)    # a @ b + bias, added in the kernel's store
    layer = day87_fast.Linear(768, 3072)       # nn.Linear's drop-in (linear.py)

Built ahead of time on the LibTorch stable ABI (fast/setup.py): importing loads a library
and compiles nothing. The wheel holds two: one with the CUDA kernels, for a torch built
with CUDA, and one of the float64 CPU reference alone, for a torch built without.

What this file adds to fast/csrc/binding.cpp's registrations: the fakes, the autograd
formulas (the tensor-core backward on CUDA, the lesson's float64 formula elsewhere, with
b's gradient in b's layout: layouts.py), and wmma_mm_bias's. What it shares with the
lesson's op.py is copied in lesson_copy.py; loading the library is _loading.py's.
"""

import torch

from . import _loading, layouts, lesson_copy
from .linear import Linear  # nn.Linear's drop-in, on this operator

__version__ = "0.88.0"  # the version's one place: fast/setup.py reads it from here
# The package's API: what dir(day87_fast) shows (__dir__, at the end), not what it imports.
__all__ = ["wmma_mm", "wmma_mm_bias", "Linear", "BUILD", "__version__"]
NAMESPACE = _loading.NAMESPACE


def wmma_mm(a, b):
    """a @ b through day87_fast::wmma_mm: the lesson's wmma_mm, tuned."""
    lesson_copy.check_tensors("day87_fast::wmma_mm", a, b)
    return torch.ops.day87_fast.wmma_mm(a, b)


def wmma_mm_bias(a, b, bias):
    """a @ b + bias through day87_fast::wmma_mm_bias, the bias added in the kernel's
    store: float16 a, b and float32 bias in, float32 out on CUDA; float64 on the CPU."""
    lesson_copy.check_tensors("day87_fast::wmma_mm_bias", a, b)
    return torch.ops.day87_fast.wmma_mm_bias(a, b, bias)


def _fake(a, b):
    lesson_copy.check_matrices("day87_fast::wmma_mm", a, b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=lesson_copy.accumulate_dtype(a.dtype))


def _fake_bias(a, b, bias):
    # fast/csrc/binding.cpp's rules in its order: the bias's device, a and b's rules, then
    # the bias's shape and dtype (its contiguity, like a and b's, is not the fake's
    # to check: a fake tensor's strides under compile need not be eager's).
    op_name, described = "day87_fast::wmma_mm_bias", lesson_copy.described
    torch._check(bias.device == a.device, lambda: (
        f"{op_name}: rule 'one device': bias must be on a's device; "
        f"got a: {described(a)}, bias: {described(bias)}"))
    lesson_copy.check_matrices(op_name, a, b)
    torch._check(bias.dim() == 1 and bias.shape[0] == b.shape[1], lambda: (
        f"{op_name}: rule 'bias': bias must be 1-D with one value per column of b; "
        f"got bias: {described(bias)}, b: {described(b)}"))
    # Only now, a's dtype past its rule: accumulate_dtype has no answer for a float32 a,
    # and its TypeError would stand where eager names rule 'dtype'.
    accumulate = lesson_copy.accumulate_dtype(a.dtype)
    torch._check(bias.dtype == accumulate, lambda: (
        f"{op_name}: rule 'dtype': on {bias.device} bias must be "
        f"{lesson_copy.scalar_type(accumulate)}; got bias: {described(bias)}"))
    return a.new_empty((a.shape[0], b.shape[1]), dtype=accumulate)


def _backward(ctx, grad):
    # Grad mode is on in a backward only under create_graph=True (a gradient penalty,
    # a Hessian-vector product): then the formula must itself be differentiable, and
    # the lesson's two matmuls are. So is the float64 path.
    if not grad.is_cuda or torch.is_grad_enabled():
        return layouts.backward_formula(ctx, grad)
    # The same two products on tensor cores, in one call: fast/csrc/binding.cpp's
    # wmmaMmBackwardCuda. It returns None where that gradient is not wanted
    # (setup_context saved only the partner of each wanted gradient).
    a, b = ctx.saved_tensors
    return torch.ops.day87_fast.wmma_mm_backward(grad, a, b)


def _fake_backward(grad, a, b):
    # wmma_mm_backward's output metadata, for torch.compile's trace of the backward:
    # grad_a where b is given, grad_b where a is given, FP16 like the inputs.
    return (grad.new_empty((grad.shape[0], b.shape[0]), dtype=b.dtype) if b is not None else None,
            grad.new_empty((a.shape[1], grad.shape[1]), dtype=a.dtype) if a is not None else None)


def _setup_context_bias(ctx, inputs, output):
    # grad_a and grad_b need what wmma_mm's need; grad_bias needs no saved value.
    layouts.setup_context(ctx, inputs[:2], output)


def _backward_bias(ctx, grad):
    grad_a, grad_b = _backward(ctx, grad)
    # bias[j] is added to every row of column j with derivative 1, so its gradient
    # is grad summed down the rows, in grad's own dtype (FP32 on CUDA: an FP16 sum
    # of 8192 rows of gradients near 10 would pass FP16's largest value).
    grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
    return grad_a, grad_b, grad_bias


def _register():
    """The registrations that live in Python, run once the library is loaded."""
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    torch.library.register_fake("day87_fast::wmma_mm", _fake, lib=library)
    torch.library.register_autograd("day87_fast::wmma_mm", _backward,
                                    setup_context=layouts.setup_context, lib=library)
    torch.library.register_fake("day87_fast::wmma_mm_backward", _fake_backward, lib=library)
    torch.library.register_fake("day87_fast::wmma_mm_bias", _fake_bias, lib=library)
    torch.library.register_autograd("day87_fast::wmma_mm_bias", _backward_bias,
                                    setup_context=_setup_context_bias, lib=library)
    return library


BUILD = _loading.load()  # what was built and loaded (fast/src/day87_fast/README.md)
if "_registrations" in globals():  # importlib.reload: drop the previous module's first
    _registrations._destroy()
_registrations = _register()


def __dir__():  # the API alone, where a notebook completes names too
    return sorted(__all__)
