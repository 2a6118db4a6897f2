"""backward_variants.py: the candidates for the fast tier's CUDA backward, timed and checked.

    python fast/backward_variants.py        (needs a GPU and triton)

How the backward's design was first chosen (2026-11-30): an FP32 grad scaled by a
power of two, products on tensor cores in FP16. The candidates are ATen ops, and the
forward they follow is day87_fast::wmma_mm (fast_op.py); the backward now runs that
design as fast/binding.cpp's one call (checks/NOTES.md, "The backward", has those
kernels' candidates and figures). Each candidate computes grad_a = grad @ b^T and
grad_b = a^T @ grad from an FP32 grad and FP16 a, b, and returns FP16 gradients.
Times are triton.testing.do_bench medians of forward (the op) plus the candidate's
backward, beside the fp16 `x @ w` forward and backward through autograd. Accuracy is
||got - reference|| / ||reference|| against float64, on randn gradients and on
gradients of magnitude 1e-7 to 1e-5.
"""

import os
import sys

import torch
import triton.testing

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [FAST, os.path.dirname(FAST)]  # fast_op.py, and the lesson it imports
import fast_op  # noqa: E402


def power_of_two_scale(grad):
    """2^s with max|grad| * 2^s in [2^14, 2^15), and 2^-s, built from their bits."""
    exponent = torch.frexp(torch.linalg.vector_norm(grad, float("inf"))).exponent
    shift = (15 - exponent).clamp(-126, 126)
    return ((shift + 127) << 23).view(torch.float32), ((127 - shift) << 23).view(torch.float32)


def fp32_library(grad, a, b):  # the lesson's formula
    return (torch.matmul(grad, b.t().float()).half(), torch.matmul(a.t().float(), grad).half())


def tf32_global(grad, a, b):  # for reference only: flips a global flag
    torch.backends.cuda.matmul.allow_tf32 = True
    try:
        return fp32_library(grad, a, b)
    finally:
        torch.backends.cuda.matmul.allow_tf32 = False


def scaled_cublas(grad, a, b):
    scale, unscale = power_of_two_scale(grad)
    grad16 = (grad * scale).half()
    return ((torch.mm(grad16, b.t(), out_dtype=torch.float32) * unscale).half(),
            (torch.mm(a.t(), grad16, out_dtype=torch.float32) * unscale).half())


def scaled_cublas_fused_casts(grad, a, b):
    scale, unscale = power_of_two_scale(grad)
    grad16 = torch.mul(grad, scale, out=torch.empty_like(grad, dtype=torch.half))
    grad_a = torch.mm(grad16, b.t(), out_dtype=torch.float32)
    grad_b = torch.mm(a.t(), grad16, out_dtype=torch.float32)
    return (torch.mul(grad_a, unscale, out=torch.empty_like(grad_a, dtype=torch.half)),
            torch.mul(grad_b, unscale, out=torch.empty_like(grad_b, dtype=torch.half)))


def scaled_wmma(grad, a, b):  # the op's own kernel, transposed operands made contiguous
    scale, unscale = power_of_two_scale(grad)
    grad16 = (grad * scale).half()
    return ((fast_op.wmma_mm(grad16, b.t().contiguous()) * unscale).half(),
            (fast_op.wmma_mm(a.t().contiguous(), grad16) * unscale).half())


def autocast_path(grad, a, b):  # what fp16 autocast computes: grad arrives in FP16
    grad16 = grad.half()
    return grad16 @ b.t(), a.t() @ grad16


CANDIDATES = {"fp32 library (lesson)": fp32_library, "tf32, global flag": tf32_global,
              "scaled fp16, cuBLAS": scaled_cublas,
              "scaled fp16, cuBLAS, fused casts": scaled_cublas_fused_casts,
              "scaled fp16, own WMMA": scaled_wmma, "fp16 autocast path": autocast_path}


def small_gradients(shape):
    magnitude = 10 ** torch.empty(shape, device="cuda").uniform_(-7, -5)
    return magnitude * torch.randn(shape, device="cuda").sign()


def main():
    if not torch.cuda.is_available():
        print("backward_variants.py needs a GPU; nothing to measure here.")
        return
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    for m, k, n in [(8192, 4096, 4096), (256, 384, 512)]:
        a = torch.randn(m, k, device="cuda").half()
        b = torch.randn(k, n, device="cuda").half()
        grad = torch.randn(m, n, device="cuda")
        x, w = a.clone().requires_grad_(), b.clone().requires_grad_()
        grad16 = grad.half()

        def fp16_autograd():
            (x @ w).backward(grad16)
        base = triton.testing.do_bench(fp16_autograd, return_mode="median")
        forward = triton.testing.do_bench(lambda: fast_op.wmma_mm(a, b), return_mode="median")
        print(f"\n{m}x{k}x{n}: fp16 x @ w fwd+bwd {base:.3f} ms; op forward {forward:.3f} ms")
        for name, candidate in CANDIDATES.items():
            if name == "fp16 autocast path":
                continue
            ms = triton.testing.do_bench(lambda: (fast_op.wmma_mm(a, b), candidate(grad, a, b)),
                                         return_mode="median")
            print(f"  {name:<36} fwd+bwd {ms:.3f} ms  {ms / base:.2f}x the fp16 path")

    m, k, n = 2048, 1024, 1536
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(k, n, device="cuda").half()
    print(f"\naccuracy at {m}x{k}x{n}, ||got - ref|| / ||ref|| against float64 (grad_a, grad_b)")
    for regime, grad in (("randn", torch.randn(m, n, device="cuda")),
                         ("1e-7..1e-5", small_gradients((m, n)))):
        reference = (grad.double() @ b.double().t(), a.double().t() @ grad.double())
        for name, candidate in CANDIDATES.items():
            got = candidate(grad, a, b)
            errors = [((g.double() - r).norm() / r.norm()).item() for g, r in zip(got, reference)]
            print(f"  {regime:<11}{name:<36}{errors[0]:.3e}  {errors[1]:.3e}")


if __name__ == "__main__":
    main()
