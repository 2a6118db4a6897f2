"""hardening.py: rows 15 and 16, what the operator supports beyond the lesson's questions.

    python checks/hardening.py

Second derivatives (a gradient penalty or a Hessian-vector product takes them) and
CUDA graph capture: neither is a question the lesson asks, so neither is in the
student's table (test_op.py), but a change to the operator must not break them.
They take an Operator as test_op.py's rows do: fast/tests/test_fast.py appends ROWS to
its table, and checks/self_test.py hands them deliberately wrong operators. An
operator whose backward rounds more than the lesson's gives its gradients an
allowance of its own (gradient_ratio says how). The last line is "N passed, N
failed, N skipped"; the exit status is 1 if anything failed.
"""

import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lesson
import torch  # noqa: E402
from torch.autograd.gradcheck import GradcheckError  # noqa: E402

from test_op import (LESSON, Fail, error_ratio, fresh, reference_and_bound, require,  # noqa: E402
                     require_gpu, run_table, why_no_kernel, worst_ratio)


def gradient_ratio(operator, result, a, b):
    """How much of its bound a gradient, result = a @ b, uses against float64: 1.0 is the
    edge. The bound is test_op.py's, plus the operator's gradient_allowance(a, b) where
    it has one: fast/'s backward rounds grad to FP16 before it multiplies, an error the
    lesson's bound does not cover. The lesson's operator has none."""
    reference, bound = reference_and_bound(result, a, b)
    allowance = getattr(operator, "gradient_allowance", None)
    if allowance is not None:
        bound = bound + allowance(a, b)
    return worst_ratio(result, reference, bound)


def check_double_backward(operator, device):
    """Second derivatives, as a gradient penalty or a Hessian-vector product takes
    them (create_graph=True). On the CPU, gradgradcheck in float64; on CUDA, the
    gradient of a function of the first gradients against float64. Failure modes:
    a backward built from operations autograd cannot differentiate (out= products,
    anything under no_grad) raises there or gives no second derivative."""
    mm = operator.wrapper
    if device == "cpu":
        a, b = (fresh(4, 3, dtype=torch.float64, requires_grad=True),
                fresh(3, 5, dtype=torch.float64, requires_grad=True))
        try:
            torch.autograd.gradgradcheck(mm, (a, b))
        except GradcheckError as error:
            raise Fail(f"gradgradcheck: {str(error).splitlines()[0]}") from None
        return "gradgradcheck: second derivatives agree with numerical ones"
    require_gpu(operator)
    m, k, n = 128, 32, 256
    a = fresh(m, k, dtype=torch.half, device="cuda", requires_grad=True)
    b = fresh(k, n, dtype=torch.half, device="cuda", requires_grad=True)
    weights = [fresh(*shape, dtype=torch.float32, device="cuda")
               for shape in ((m, n), (m, k), (k, n))]

    def penalty(a, b, matmul, weights):  # a function of the first gradients
        out, weight_a, weight_b = weights
        grad_a, grad_b = torch.autograd.grad((torch.tanh(matmul(a, b)) * out).sum(), (a, b),
                                             create_graph=True)
        return (grad_a.to(out.dtype) * weight_a).sum() + (grad_b.to(out.dtype) * weight_b).sum()

    try:
        penalty(a, b, mm, weights).backward()
    except RuntimeError as error:
        raise Fail(f"backward with create_graph=True: {str(error).splitlines()[0]}") from None
    wide = [t.detach().double().cpu().requires_grad_() for t in (a, b)]
    penalty(*wide, torch.mm, [w.double().cpu() for w in weights]).backward()
    # FP16 inputs and first gradients (2^-11 each) and FP32 sums: about 1e-3 in
    # norm, as in check 7. No second derivative, or a wrong one, is off by order 1.
    for name, got, expected in (("a", a.grad, wide[0].grad), ("b", b.grad, wide[1].grad)):
        require(got is not None, f"no second derivative reached {name}")
        error = (got.double().cpu() - expected).norm() / expected.norm()
        require(error <= 1e-2, f"second derivative for {name} is off by {error:.2e}")
    return "second derivatives for a and b match float64"


def check_cuda_graph(operator):
    """Forward and backward captured once, replayed on new values and gradients
    of other magnitudes. Failure modes: an op or backward that synchronizes or
    reads a value back cannot be captured; one that launches off the capturing
    stream, or keeps a scale from capture time, replays stale or overflowed results."""
    mm = operator.wrapper
    require_gpu(operator)
    # The lesson's first shape: an operator that splits K where the grid of tiles is
    # small has its workspace and its second kernel captured too.
    a = fresh(256, 384, dtype=torch.half, device="cuda", requires_grad=True)
    b = fresh(384, 512, dtype=torch.half, device="cuda", requires_grad=True)
    grad = fresh(256, 512, dtype=torch.float32, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        mm(a, b).backward(grad)
    torch.cuda.current_stream().wait_stream(warmup)
    a.grad = b.grad = None  # the capture allocates them, and each replay rewrites them
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = mm(a, b)
        c.backward(grad)
    worst = 0.0
    for magnitude in (1e-6, 1.0, 30.0):  # 30: grad_a stays inside FP16's range
        with torch.no_grad():
            a.copy_(fresh(*a.shape, dtype=torch.half))
            b.copy_(fresh(*b.shape, dtype=torch.half))
            grad.copy_(magnitude * fresh(*grad.shape, dtype=torch.float32))
            c.fill_(math.nan)  # a replay that writes nothing leaves NaN
        graph.replay()
        torch.cuda.synchronize()
        worst = max(worst, error_ratio(c, a, b), gradient_ratio(operator, a.grad, grad, b.t()),
                    gradient_ratio(operator, b.grad.t(), grad.t(), a))
        require(worst <= 1.0,
                f"replay with gradients of {magnitude:g}: {100 * worst:.3g}% of bound")
    return f"3 replays, gradients 1e-6 to 30, worst {100 * worst:.1f}% of bound"


# (name, what it compares, check(operator)): whoever runs the rows passes the operator
# (this file's main, fast/tests/test_fast.py, checks/self_test.py). The CUDA graph last: a
# capture that fails leaves the CUDA generator in capture state, and every later
# torch.randn on the GPU in this process raises.
ROWS = (("15 double backward, cpu f64", "gradgradcheck: second derivatives",
         lambda operator: check_double_backward(operator, "cpu")),
        ("15 double backward, cuda f16", "grad of a function of the grads vs float64",
         lambda operator: check_double_backward(operator, "cuda")),
        ("16 CUDA graph", "fwd+bwd captured once, replayed on new values", check_cuda_graph))


if __name__ == "__main__":
    reason = why_no_kernel()
    ok = run_table([(name, compares, lambda check=check: check(LESSON))
                    for name, compares, check in ROWS],
                   notes=[f"the CUDA kernel was not run: {reason}"] if reason else [])
    sys.exit(0 if ok else 1)
