"""scaled_backward_checks.py: what day87_fast's backward must prove beyond the lesson's table.

The lesson's backward multiplies in FP32. This folder's multiplies on tensor cores:
it scales grad by a power of two, rounds it to FP16, runs two FP16 products and
divides the scale back out. That rounding needs an allowance on top of the lesson's
bound (gradient_allowance, which gradient_ratio adds; checks/hardening.py's row 16
asks the operator for it), so this folder's row 13 is its own
(check_backward_accuracy: the lesson's gradients, with the allowance). And the scale
can go wrong in ways the lesson's backward cannot (check_scaled_backward_accuracy,
one row of the fast operator's table; fast/proof/self_test_fast.py plants each way).
"""

import torch

from tests import lesson_folder  # noqa: F401  the lesson's test_op.py importable
import test_op  # noqa: E402  the lesson's harness: its bound, its helpers


def rounded_left_allowance(a64, b64, magnitude):
    """The error beyond test_op.reference_and_bound's bound, for a product whose left
    operand `a` went through FP16 on the way: a backward that multiplies grad by an
    exact power of two putting its largest magnitude in [2^14, 2^15), rounds it to
    FP16, and divides the scale back out of the product. `magnitude` is |a| @ |b|.
    Scaling by a power of two is exact both ways, so the one new error is that
    rounding, once per element a_ip:
    - where the scaled element is a normal FP16 number, half an ulp, 2^-11 relative:
      |error of a_ip| <= 2^-11 |a_ip|; summed against |b_pj|, 2^-11 * magnitude_ij;
    - where it is subnormal, half the subnormal spacing 2^-24, 2^-25 absolute in
      scaled units; the scale is at least 2^14 / max|a|, so in a's own units
      |error of a_ip| <= 2^-25 * 2^-14 * max|a| = max|a| * 2^-39; summed against
      |b_pj|, max|a| * 2^-39 * sum_p |b_pj|.
    Each element takes one case or the other; the sum of both covers either."""
    largest = a64.abs().max() if a64.numel() else 0.0  # an empty `a` has no largest
    return 2.0**-11 * magnitude + 2.0**-39 * largest * b64.abs().sum(0)


def gradient_allowance(a, b):
    """rounded_left_allowance for a gradient written as a @ b with the rounded grad on the
    left (grad_a = grad @ b^T; grad_b^T = grad^T @ a), in float64 on the CPU, as
    test_op's bound is."""
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    return rounded_left_allowance(a64, b64, a64.abs() @ b64.abs())


def gradient_ratio(result, a, b):
    """How much of its bound a gradient of day87_fast's, result = a @ b, uses against
    float64: test_op's bound plus gradient_allowance. 1.0 is the edge."""
    reference, bound = test_op.reference_and_bound(result, a, b)
    return test_op.worst_ratio(result, reference, bound + gradient_allowance(a, b))


# Gradients of every kind the scale must survive, smallest first: a backward that
# keeps the scale of an earlier call overflows on the randn ones that follow.
GRADIENT_KINDS = ("1e-7..1e-5", "randn", "all positive", "all negative", "largest first",
                  "largest last", "padded rows")
# Those of the lesson's row 13, which this folder's row 13 runs.
LESSON_GRADIENT_KINDS = ("1e-7..1e-5", "randn", "padded rows")


def gradient_of_kind(kind, m, n):
    """An FP32 gradient, m x n, on the GPU, of one of GRADIENT_KINDS."""
    if kind == "padded rows":  # as torch.cat([c1, c2], dim=1) hands c1: row stride n + 8
        return torch.randn(m, n + 8, device="cuda")[:, :n]
    grad = torch.randn(m, n, device="cuda")
    if kind == "1e-7..1e-5":
        grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
    elif kind.startswith("all"):
        grad = grad.abs() * (1 if kind == "all positive" else -1)
    elif kind.startswith("largest"):  # 64 times the rest, in the first or the last element
        grad.view(-1)[0 if kind == "largest first" else -1] = 64 * grad.abs().max()
    return grad


def backward_of_kind(operator, kind):
    """The operator's backward at the lesson's first shape for a gradient of `kind`:
    (a, b, grad), a.grad and b.grad filled, and the larger gradient_ratio of the two."""
    m, k, n = 256, 384, 512
    a = test_op.fresh(m, k, dtype=torch.half, device="cuda", requires_grad=True)
    b = test_op.fresh(k, n, dtype=torch.half, device="cuda", requires_grad=True)
    grad = gradient_of_kind(kind, m, n)
    operator.wrapper(a, b).backward(grad)
    worst = max(gradient_ratio(a.grad, grad, b.t()), gradient_ratio(b.grad.t(), grad.t(), a))
    return a, b, grad, worst


def check_backward_accuracy(operator):
    """Row 13 for day87_fast: the lesson's row 13 (tiny gradients, whose FP16 results
    are subnormal; randn; a grad with padded rows, which a backward that reads grad as
    one dense run gets wrong), within the lesson's bound plus gradient_allowance."""
    test_op.require_gpu(operator)
    report = []
    for kind in LESSON_GRADIENT_KINDS:
        *_, worst = backward_of_kind(operator, kind)
        test_op.require(worst <= 1.0, f"{kind}: {100 * worst:.3g}% of the bound")
        report.append(f"{kind}: {100 * worst:.1f}%" + (" of bound" if not report else ""))
    return "; ".join(report)


def check_scaled_backward_accuracy(operator):
    """grad_a and grad_b from FP32 gradients of every kind in GRADIENT_KINDS against
    float64, within gradient_ratio's bound, and no worse than the fp16 autocast path
    (grad cast to FP16 as it is), which the scaling exists to beat. Failure modes of
    a backward that scales grad into FP16: a scale kept from an earlier call
    overflows on larger gradients; grad cast to FP16 unscaled loses values under
    6e-5; a scale derived from the signed maximum overflows on gradients that are
    all negative; a largest-magnitude pass that misses the first element, or the
    last block's rows, overflows where the largest value sits there; and one that
    reads padded rows as dense takes the padding for values."""
    test_op.require_gpu(operator)
    report = []
    for kind in GRADIENT_KINDS:
        a, b, grad, worst = backward_of_kind(operator, kind)
        test_op.require(worst <= 1.0, f"{kind}: {100 * worst:.3g}% of the bound")
        reference = grad.double() @ b.double().t()
        error, fp16_error = ((g.double() - reference).norm() / reference.norm()
                             for g in (a.grad, grad.half() @ b.t()))
        # On randn gradients both paths round the same values once and land equal;
        # the 2% is for the noise between two results of the same precision.
        test_op.require(error <= 1.02 * fp16_error,
                        f"{kind}: relative error {error:.2e}, fp16 path {fp16_error:.2e}")
        detail = f" of bound, {error:.1e} (fp16 path {fp16_error:.1e})" if len(report) < 2 else ""
        report.append(f"{kind}: {100 * worst:.1f}%" + detail)
    return "; ".join(report)


# (name, what it compares, check(operator)), as checks/hardening.py's ROWS: row 13
# in place of the lesson's, and the scaled row after row 14.
BACKWARD_ACCURACY_ROW = ("13 backward accuracy", "grads: tiny, randn, padded rows vs float64",
                         check_backward_accuracy)
SCALED_BACKWARD_ROW = ("13 backward accuracy, scaled",
                       "grads: one sign, big at either end, vs fp16",
                       check_scaled_backward_accuracy)
