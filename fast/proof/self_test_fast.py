"""self_test_fast.py: the fast operator's checks against deliberately wrong backwards.

    cd fast && python -m proof.self_test_fast

A check that cannot fail proves nothing (checks/self_test.py does this for the
lesson's table). day87_fast's backward scales grad into FP16 by a power of two,
and the scale can go wrong in ways the lesson's FP32 backward cannot. Each row here
hands one check the fast operator (tests/test_fast.py's FAST, its gradient allowance
included) with a backward that gets the scale wrong in one way, and passes only when
the check fails: the fast operator's own row, "13 backward accuracy, scaled", on five
of them; row 16 (CUDA graph) on a scale kept from an earlier call; row 11 (no host
sync) on a scale computed on the host. The wrong backwards run over the lesson's
kernel, registered in a namespace of their own, day87_fast_wrong. Without a GPU
every row skips; the exit status is 1 if any row failed.
"""

import math
import sys

import torch

from tests import lesson_folder  # noqa: F401  the lesson's op.py, test_op.py and checks/

import hardening
import test_op
from day87_fast import lesson_copy  # setup_context, and the accumulate dtype for the fake
from self_test import must_fail_rows
from tests.scaled_backward_checks import SCALED_BACKWARD_ROW, check_scaled_backward_accuracy
from tests.test_fast import FAST


def products(ctx, half_grad, scale):
    """grad_a, grad_b from an FP16 grad scaled by `scale`: FP16 products, FP32 sums,
    the scale divided back out; day87_fast's backward in PyTorch, but for its scale."""
    a, b = ctx.saved_tensors

    def product(left, right):  # FP16 in, FP32 sums, the scale out, rounded to FP16
        return (torch.mm(left, right, out_dtype=torch.float32) / scale).half()

    return (product(half_grad, b.t()) if b is not None else None,
            product(a.t(), half_grad) if a is not None else None)


def syncing_backward(ctx, grad):  # the scale computed on the host: .item() waits for the GPU
    largest = torch.linalg.vector_norm(grad, float("inf")).item()
    scale = 2.0 ** (15 - math.frexp(largest)[1]) if largest else 1.0
    return products(ctx, (grad * scale).half(), scale)


KEPT_SCALE = {}  # stale_scale_backward's, from the first gradient it saw


def stale_scale_backward(ctx, grad):  # keeps the scale of the first gradient it saw
    if "scale" not in KEPT_SCALE:
        exponent = torch.frexp(torch.linalg.vector_norm(grad, float("inf"))).exponent
        KEPT_SCALE["scale"] = torch.exp2((15 - exponent).float())
    return products(ctx, (grad * KEPT_SCALE["scale"]).half(), KEPT_SCALE["scale"])


def unscaled_backward(ctx, grad):  # what autocast does: grad cast to FP16 as it is
    return products(ctx, grad.half(), 1.0)


def scaled_from(largest, ctx, grad):  # a power-of-two scale from a largest magnitude found wrongly
    scale = torch.exp2((15 - torch.frexp(largest).exponent).float())
    return products(ctx, (grad * scale).half(), scale)


def signed_maximum_backward(ctx, grad):  # max(grad) where max|grad| is meant
    return scaled_from(grad.amax().clamp_min(0), ctx, grad)


def misses_first_element_backward(ctx, grad):  # the largest-magnitude pass starts one element late
    return scaled_from(grad.reshape(-1)[1:].abs().amax(), ctx, grad)


def misses_last_block_backward(ctx, grad):  # the pass leaves out the last block's row
    return scaled_from(grad[:-1].abs().amax(), ctx, grad)


def wrong_scaled_backwards():
    """Operators whose forward is the lesson's kernel and whose backward scales grad
    into FP16 wrongly, one way each: (the Library that keeps them registered,
    {what is wrong: the operator})."""
    wrong = {  # the name each registers under, and its backward
        "syncing_backward": syncing_backward, "stale_scale": stale_scale_backward,
        "unscaled": unscaled_backward, "signed_maximum": signed_maximum_backward,
        "misses_first_element": misses_first_element_backward,
        "misses_last_block": misses_last_block_backward,
    }
    library = torch.library.Library("day87_fast_wrong", "DEF")

    def opaque_kernel(a, b):
        # Like a C++ kernel, invisible to autograd: without no_grad, autograd
        # would record the inner wmma_mm call and differentiate through it.
        with torch.no_grad():
            return torch.ops.day87.wmma_mm(a, b)

    def fake(a, b):  # the forward's shape and dtype, as day87_fast's fake gives them
        return a.new_empty((a.shape[0], b.shape[1]), dtype=lesson_copy.accumulate_dtype(a.dtype))

    for name, backward in wrong.items():
        library.define(f"{name}(Tensor a, Tensor b) -> Tensor")
        for device in ("CPU", "CUDA"):  # per-device kernels, as binding.cpp registers
            library.impl(name, opaque_kernel, device)
        torch.library.register_fake(f"day87_fast_wrong::{name}", fake, lib=library)
        torch.library.register_autograd(f"day87_fast_wrong::{name}", backward,
                                        setup_context=lesson_copy.setup_context, lib=library)
    operators = torch.ops.day87_fast_wrong
    return library, {
        "backward computes its scale on the host": operators.syncing_backward,
        "backward keeps its first scale": operators.stale_scale,
        "backward casts grad to FP16 unscaled": operators.unscaled,
        "scale from the signed maximum": operators.signed_maximum,
        "scale misses the first element": operators.misses_first_element,
        "scale misses the last block": operators.misses_last_block,
    }


def prove_rows():
    library, variants = wrong_scaled_backwards()
    scaled_row = SCALED_BACKWARD_ROW[0]
    # (row, its check given an Operator, the wrong variant it must fail on)
    cases = [
        ("11 no host sync", test_op.check_no_host_sync, "backward computes its scale on the host"),
        # The kept scale is the first gradient's: the scaled row's smallest kind,
        # 1e-7..1e-5, whose scale overflows everything larger after it.
        (scaled_row, check_scaled_backward_accuracy, "backward keeps its first scale"),
        (scaled_row, check_scaled_backward_accuracy, "backward casts grad to FP16 unscaled"),
        (scaled_row, check_scaled_backward_accuracy, "scale from the signed maximum"),
        (scaled_row, check_scaled_backward_accuracy, "scale misses the first element"),
        (scaled_row, check_scaled_backward_accuracy, "scale misses the last block"),
        # Last: a capture that fails midway leaves the CUDA generator in capture
        # state, and every later torch.randn on the GPU in this process raises.
        ("16 CUDA graph", hardening.check_cuda_graph, "backward keeps its first scale"),
    ]
    return must_fail_rows(cases, variants, library, FAST)


def main():
    test_op.print_provenance(FAST)
    print("Each of the fast operator's checks, run against a backward that scales")
    print("grad into FP16 wrongly, must fail.\n")
    ok = test_op.run_table(prove_rows())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
