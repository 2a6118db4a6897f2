"""test_op.py: the day 87 harness, a plain script (no pytest).

    python test_op.py                 # provenance, then the lesson's table of checks
    python test_op.py --self-test     # every check run against a deliberately wrong
                                      # variant; each must fail, for the right reason
    python test_op.py --fuzz N [--seed S]   # N random calls, valid and invalid

Each row prints pass, FAIL or skip (with the reason). The last line is
"N passed, N failed, N skipped", and the exit status is 1 if anything failed.
Without a GPU the CUDA rows skip and the CPU rows still run.

The error bound used for every FP16 result, and why:
  FP16 x FP16 products are exact in FP32 (11 + 11 significand bits fit in 24), so
  all error comes from adding K products in FP32. In any order, with round-to-
  nearest, |error| <= (K - 1) * 2^-24 * sum_p |a_ip b_pj|. Tensor cores may
  truncate rather than round, so we allow 2^-23 per addition:
      bound_ij = K * 2^-23 * (|A| @ |B|)_ij.
  Rows report the worst |c - reference| / bound as a percentage: 100% is the edge.
"""

import argparse
import datetime
import faulthandler
import math
import os
import platform
import random
import re
import subprocess
import sys
import warnings

import torch
from torch.autograd.gradcheck import GradcheckError

import op
from table import Fail, Skip, require, run_table

def require_gpu(count=1):
    if not torch.cuda.is_available():
        raise Skip("no GPU visible")
    if not op.BUILD["with_cuda"]:
        raise Skip("extension built without its CUDA part")
    if torch.cuda.device_count() < count:
        raise Skip(f"needs {count} GPUs")


# ---------------------------------------------------------------------------
# References and bounds
# ---------------------------------------------------------------------------
def fresh(*shape, dtype, device="cpu", requires_grad=False):
    """Fresh standard-normal values, never zeros."""
    tensor = torch.randn(*shape, dtype=torch.float64).to(device=device, dtype=dtype)
    return tensor.requires_grad_(requires_grad)


def product_error_ratio(result, a, b, extra=None):
    """Worst |result - a @ b (+ extra)| / bound over all elements, in float64.

    The bound is K * unit * (|a| @ |b| (+ |extra|)): unit = 2^-23 where the
    product accumulates in FP32 (see the module docstring), 2^-51 in float64.
    A result stored in FP16 (a gradient) is rounded once more: half an FP16 ulp,
    2^-11 relative, or 2^-25 absolute near zero."""
    a64, b64 = a.detach().double().cpu(), b.detach().double().cpu()
    reference, magnitude = a64 @ b64, a64.abs() @ b64.abs()
    if extra is not None:
        extra64 = extra.detach().double().cpu()
        reference, magnitude = reference + extra64, magnitude + extra64.abs()
    result64 = result.detach().double().cpu()
    if result64.shape != reference.shape:
        raise Fail(f"shape {tuple(result64.shape)}, expected {tuple(reference.shape)}")
    if not torch.isfinite(result64).all():
        return math.inf
    if result64.numel() == 0:
        return 0.0
    unit = 2.0**-51 if a.dtype == torch.float64 else 2.0**-23
    terms = a.shape[1] + (extra is not None)
    bound = terms * unit * magnitude + torch.finfo(torch.float64).tiny
    if result.dtype == torch.half:
        bound += 2.0**-11 * reference.abs() + 2.0**-25
    return ((result64 - reference).abs() / bound).max().item()


def poison_allocator(shape, device):
    """Free a NaN-filled block of the output's size, so the caching allocator hands
    the same memory to the operator: an element the kernel never writes stays NaN."""
    torch.full(shape, math.nan, dtype=torch.float32, device=device)


def forward_on_gpu(mm, m, n, k, bias=False):
    """mm on fresh FP16 inputs against float64; returns the % of the bound used."""
    require_gpu()
    a, b = fresh(m, k, dtype=torch.half, device="cuda"), fresh(k, n, dtype=torch.half, device="cuda")
    extra = fresh(n, dtype=torch.float32, device="cuda") if bias else None
    poison_allocator((m, n), "cuda")
    c = mm(a, b) if extra is None else mm(a, b, extra)
    torch.cuda.synchronize()
    require(c.dtype == torch.float32 and c.device == a.device,
            f"output is {c.dtype} on {c.device}, expected float32 on {a.device}")
    ratio = product_error_ratio(c, a, b, extra)
    require(ratio <= 1.0, f"error is {100 * ratio:.1f}% of the bound")
    return f"{100 * ratio:.1f}% of bound"


# ---------------------------------------------------------------------------
# The lesson's checks. Each takes the operator it checks as `mm`, so that
# --self-test can hand it a deliberately wrong variant and watch it fail.
# ---------------------------------------------------------------------------
def expect_raise(mm, a, b, rule):
    """The call must raise an error that names `rule`."""
    try:
        mm(a, b)
    except (RuntimeError, ValueError, TypeError) as error:
        require(f"'{rule}'" in str(error),
                f"rule '{rule}': raised, but the message does not name it: {error}")
        return
    raise Fail(f"rule '{rule}': the call returned instead of raising "
               f"(a {tuple(a.shape)} {a.dtype} {a.device}, strides {a.stride()}; "
               f"b {tuple(b.shape)} {b.dtype} {b.device}, strides {b.stride()})")


def check_contract_cpu(mm):
    f64 = torch.float64
    calls = [
        (fresh(4, 3, dtype=torch.float32), fresh(3, 5, dtype=torch.float32), "dtype"),
        (fresh(4, 3, dtype=f64), fresh(3, dtype=f64), "two matrices"),
        (fresh(4, 3, dtype=f64), fresh(4, 5, dtype=f64), "inner dimensions"),
        (fresh(4, 3, dtype=f64), fresh(5, 3, dtype=f64).t(), "contiguous"),
    ]
    for a, b, rule in calls:
        expect_raise(mm, a, b, rule)
    return f"{len(calls)} calls raised, each naming its rule"


def check_contract_cuda(mm):
    # Failure modes: a rule that is not checked returns garbage (a transposed view
    # read row-major) or faults (a misaligned 16-byte copy), and the row sees a
    # return where it expects a raise.
    require_gpu()
    half, gpu = torch.half, "cuda"
    flat = fresh(128 * 16 + 1, dtype=half, device=gpu)
    calls = [
        (fresh(128, 16, dtype=torch.float32, device=gpu), fresh(16, 128, dtype=torch.float32, device=gpu), "dtype"),
        (fresh(128, 16, dtype=half, device=gpu), fresh(16, 128, dtype=half), "one device"),
        (fresh(128, 16, dtype=half, device=gpu), fresh(128, 16, dtype=half, device=gpu).t(), "contiguous"),
        (fresh(100, 16, dtype=half, device=gpu), fresh(16, 128, dtype=half, device=gpu), "tile"),
        (flat[1:].view(128, 16), fresh(16, 128, dtype=half, device=gpu), "alignment"),
    ]
    for a, b, rule in calls:
        expect_raise(mm, a, b, rule)
    # Five errors later the CUDA context must still be usable.
    forward_on_gpu(mm, 128, 128, 16)
    return f"{len(calls)} calls raised, each naming its rule; a valid call still works"


def check_opcheck(device):
    if device == "cuda":
        require_gpu()
        a, b = fresh(128, 32, dtype=torch.half, device="cuda"), fresh(32, 256, dtype=torch.half, device="cuda")
    else:
        a, b = fresh(4, 3, dtype=torch.float64), fresh(3, 5, dtype=torch.float64)
    a.requires_grad_(), b.requires_grad_()
    results = torch.library.opcheck(torch.ops.day87.wmma_mm.default, (a, b), raise_exception=False)
    failed = {test: outcome for test, outcome in results.items() if outcome != "SUCCESS"}
    require(not failed, f"opcheck failed: {failed}")
    return ", ".join(sorted(results))


def check_gradcheck(mm):
    a, b = fresh(4, 3, dtype=torch.float64, requires_grad=True), fresh(3, 5, dtype=torch.float64, requires_grad=True)
    try:
        torch.autograd.gradcheck(mm, (a, b))
    except GradcheckError as error:
        raise Fail(f"gradcheck: {str(error).splitlines()[0]}") from None
    return "analytical and numerical Jacobians agree"


class WrongGradA(torch.autograd.Function):
    """The older autograd.Function recipe, with a formula that is wrong by 1%."""

    @staticmethod
    def forward(ctx, a, b):
        ctx.save_for_backward(a, b)
        return torch.ops.day87.wmma_mm(a, b)

    @staticmethod
    def backward(ctx, grad):
        a, b = ctx.saved_tensors
        return 1.01 * (grad @ b.t()), a.t() @ grad


def check_gradcheck_rejects():
    try:
        check_gradcheck(WrongGradA.apply)
    except Fail:
        return "GradcheckError raised for grad_a scaled by 1.01"
    raise Fail("gradcheck accepted a grad_a scaled by 1.01: it would accept anything")


def check_autograd_chain(mm, device):
    """Parameters before and after the op must all receive the right gradient.
    Failure mode: no registered backward leaves the output without a grad_fn, so
    the parameters upstream keep grad None while training appears to run."""
    if device == "cuda":
        require_gpu()
        m, k, n, dtype = 128, 32, 128, torch.half
        # FP16 rounding of the inputs and of grad_a, grad_b (2^-11 relative each)
        # and FP32 accumulation: about 1e-3 in norm. A missing or wrong formula
        # is off by order 1.
        tolerance = 1e-2
    else:
        m, k, n, dtype = 4, 3, 5, torch.float64
        tolerance = 1e-10
    x = fresh(m, k, dtype=dtype, device=device)
    upstream = fresh(m, k, dtype=dtype, device=device, requires_grad=True)
    weight = fresh(k, n, dtype=dtype, device=device, requires_grad=True)
    downstream = fresh(n, dtype=op.accumulate_dtype(dtype), device=device, requires_grad=True)
    c = mm(x * upstream, weight)
    require(c.grad_fn is not None, "the op's output has no grad_fn: the graph ends at the op")
    (torch.tanh(c) * downstream).sum().backward()

    params = {"upstream": upstream, "weight": weight, "downstream": downstream}
    wide = {name: p.detach().double().cpu().requires_grad_() for name, p in params.items()}
    reference = torch.tanh((x.double().cpu() * wide["upstream"]) @ wide["weight"])
    (reference * wide["downstream"]).sum().backward()
    for name, p in params.items():
        require(p.grad is not None, f"parameter '{name}' received no gradient")
        error = (p.grad.double().cpu() - wide[name].grad).norm() / wide[name].grad.norm()
        require(error <= tolerance, f"parameter '{name}': relative error {error:.2e} > {tolerance}")
    return "3 parameters, gradients match float64"


def check_compile(mm, device):
    """fullgraph=True, forward and backward, static and dynamic shapes.
    Failure mode: without a fake implementation Dynamo cannot trace the call; with
    fullgraph=True that raises, without it the graph would split in two."""
    import torch._dynamo
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    if device == "cuda":
        require_gpu()
        # Distinct M, K and N: where two sizes are equal, Dynamo gives them one
        # symbol ("duck sizing"), and a later call where they differ recompiles.
        dtype, shapes = torch.half, [(128, 32, 256), (256, 64, 384)]
    else:
        dtype, shapes = torch.float64, [(4, 3, 5), (6, 7, 2)]

    def model(a, b, scale):
        return torch.relu(mm(a, b)) * scale

    report = []
    for dynamic in (False, True):
        torch._dynamo.reset()
        counters.clear()
        # aot_eager: Dynamo and AOTAutograd trace with fake tensors exactly as
        # inductor would, and the compiled graph runs the same kernels as eager,
        # so outputs and gradients must equal eager to the dtype's tolerance.
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=dynamic)
        for m, k, n in shapes if dynamic else shapes[:1]:
            a = fresh(m, k, dtype=dtype, device=device, requires_grad=True)
            b = fresh(k, n, dtype=dtype, device=device, requires_grad=True)
            scale = fresh(n, dtype=op.accumulate_dtype(dtype), device=device)
            eager_inputs = [t.detach().clone().requires_grad_() for t in (a, b)]
            expected = model(*eager_inputs, scale)
            got = compiled(a, b, scale)
            torch.testing.assert_close(got, expected)
            grad = torch.randn_like(got)
            got.backward(grad)
            expected.backward(grad)
            torch.testing.assert_close(a.grad, eager_inputs[0].grad)
            torch.testing.assert_close(b.grad, eager_inputs[1].grad)
        breaks = sum(counters["graph_break"].values())
        require(counter.frame_count == 1 and breaks == 0,
                f"{'dynamic' if dynamic else 'static'}: {counter.frame_count} graphs, {breaks} breaks")
        report.append(f"{'dynamic' if dynamic else 'static'}: 1 graph, 0 breaks")
    return "; ".join(report) + "; equal to eager"


def check_stream_order(mm):
    """Inputs written on a side stream after slow work, the op called on that
    stream with no synchronization. Failure mode: a kernel launched on any other
    stream (the legacy default one, say) runs during the sleep and reads the stale
    values, so the result matches the old inputs instead of the new ones."""
    require_gpu()
    m = n = k = 256
    a, b = fresh(m, k, dtype=torch.half, device="cuda"), fresh(k, n, dtype=torch.half, device="cuda")
    new_a, new_b = fresh(m, k, dtype=torch.half, device="cuda"), fresh(k, n, dtype=torch.half, device="cuda")
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(100_000_000)  # about 50 ms of GPU cycles before the writes
        a.copy_(new_a)
        b.copy_(new_b)
        c = mm(a, b)
    torch.cuda.synchronize()
    ratio = product_error_ratio(c, new_a, new_b)
    require(ratio <= 1.0, f"result does not match the inputs written on the stream "
                          f"({100 * ratio:.3g}% of bound): the kernel ran before them")
    return f"{100 * ratio:.1f}% of bound after a 50 ms producer"


def check_cuda_graph(mm):
    """Captured once, replayed on new values. Failure mode: an op that synchronizes
    or reads a value back cannot be captured at all; one that allocates or
    launches off the capturing stream replays stale or unwritten results."""
    require_gpu()
    a, b = fresh(256, 128, dtype=torch.half, device="cuda"), fresh(128, 512, dtype=torch.half, device="cuda")
    warmup = torch.cuda.Stream()
    warmup.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warmup):
        mm(a, b)
    torch.cuda.current_stream().wait_stream(warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        c = mm(a, b)
    worst = 0.0
    for _ in range(3):
        a.copy_(fresh(*a.shape, dtype=torch.half))
        b.copy_(fresh(*b.shape, dtype=torch.half))
        c.fill_(math.nan)  # a replay that writes nothing leaves NaN
        graph.replay()
        torch.cuda.synchronize()
        worst = max(worst, product_error_ratio(c, a, b))
        require(worst <= 1.0, f"replay result is {100 * worst:.3g}% of bound")
    return f"3 replays on new values, worst {100 * worst:.1f}% of bound"


def check_profiler(mm):
    """The next lesson reads this profile. Failure mode: a call that is not the
    registered op (a raw kernel wrapper, or plain torch.mm) has no day87::wmma_mm
    event, and a kernel launched outside the op is not attributed to it."""
    require_gpu()
    from torch.profiler import ProfilerActivity, profile

    a, b = fresh(256, 128, dtype=torch.half, device="cuda"), fresh(128, 512, dtype=torch.half, device="cuda")
    mm(a, b)  # warm up outside the profile
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch's notice about profiler cycles
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            mm(a, b)
            torch.cuda.synchronize()
    events = profiler.events()
    op_events = [e for e in events if e.name == "day87::wmma_mm"]
    require(op_events, "no day87::wmma_mm event in the profile")
    def kernels_under(event):
        return [k.name for k in event.kernels] + [name for child in event.cpu_children
                                                   for name in kernels_under(child)]

    kernels = [name for e in op_events for name in kernels_under(e)]
    require(any("wmmaGemmKernel" in name for name in kernels),
            f"no wmmaGemmKernel attributed to day87::wmma_mm (its kernels: {kernels})")
    return "day87::wmma_mm -> wmmaGemmKernel"


def check_no_host_sync(mm):
    """Failure mode: a .item(), a print of a CUDA value or a synchronize inside the
    forward or backward raises under sync debug mode 'error'."""
    require_gpu()
    a = fresh(128, 64, dtype=torch.half, device="cuda", requires_grad=True)
    b = fresh(64, 256, dtype=torch.half, device="cuda", requires_grad=True)
    grad = fresh(128, 256, dtype=torch.float32, device="cuda")
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # "sync debug mode is a prototype feature"
        warnings.simplefilter("ignore", UserWarning)
        torch.cuda.set_sync_debug_mode("error")
        try:
            mm(a, b).backward(grad)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    require(a.grad is not None and b.grad is not None, "backward produced no gradients")
    return "forward and backward ran with sync debug mode 'error'"


def check_device_guard(mm):
    """Called from a thread whose current device is 0 on inputs on cuda:1. Failure
    mode: without the CUDAGuard, at::empty allocates on the current device, cuda:0,
    and the launch pairs a cuda:1 stream with the wrong device: the output comes
    back on cuda:0 (or the launch fails) and the row reports which."""
    require_gpu(count=2)
    torch.cuda.set_device(0)
    a = fresh(256, 128, dtype=torch.half, device="cuda:1", requires_grad=True)
    b = fresh(128, 512, dtype=torch.half, device="cuda:1", requires_grad=True)
    c = mm(a, b)
    require(c.device == a.device, f"output on {c.device}, inputs on {a.device}")
    require(torch.cuda.current_device() == 0,
            f"current device is {torch.cuda.current_device()} after the call, was 0")
    ratio = product_error_ratio(c, a, b)
    require(ratio <= 1.0, f"error is {100 * ratio:.3g}% of the bound")
    c.backward(torch.ones_like(c))
    require(a.grad.device == a.device and b.grad.device == b.device,
            f"gradients on {a.grad.device} and {b.grad.device}")
    require(torch.cuda.current_device() == 0, "current device changed by the backward")
    expect_raise(mm, fresh(256, 128, dtype=torch.half, device="cuda:0"), b.detach(), "one device")
    return f"output and gradients on cuda:1, {100 * ratio:.1f}% of bound, current device still 0"


# ---------------------------------------------------------------------------
# The sixth check: the exercise, day87::wmma_mm_bias
# ---------------------------------------------------------------------------
def jacobian_mismatches(fn, inputs, names, epsilon=1e-6, limit=4):
    """Analytical (backward) against numerical (central difference) Jacobians of
    fn at float64 inputs; returns one line per input whose Jacobians disagree,
    naming the worst offending entries d out[i][j] / d input[index]."""
    inputs = [x.detach().requires_grad_() for x in inputs]
    out = fn(*inputs)
    problems = []
    has_graph = out.grad_fn is not None
    if not has_graph:
        problems.append("the output has no grad_fn: no backward is registered")
    for which, (x, name) in enumerate(zip(inputs, names)):
        numerical = torch.zeros(out.numel(), x.numel(), dtype=torch.float64)
        for e in range(x.numel()):
            flat = x.detach().clone().view(-1)
            flat[e] += epsilon
            plus = fn(*[flat.view_as(x) if i == which else t.detach() for i, t in enumerate(inputs)])
            flat[e] -= 2 * epsilon
            minus = fn(*[flat.view_as(x) if i == which else t.detach() for i, t in enumerate(inputs)])
            numerical[:, e] = ((plus - minus) / (2 * epsilon)).reshape(-1)
        analytical = torch.zeros_like(numerical)
        for o in range(out.numel() if has_graph else 0):
            seed = torch.zeros_like(out).view(-1)
            seed[o] = 1
            grad = torch.autograd.grad(out, x, seed.view_as(out), retain_graph=True, allow_unused=True)[0]
            if grad is not None:
                analytical[o] = grad.reshape(-1)
        wrong = (analytical - numerical).abs() > 1e-5 + 1e-3 * numerical.abs()
        if wrong.any():
            order = (analytical - numerical).abs()[wrong].argsort(descending=True)
            rows, cols = wrong.nonzero(as_tuple=True)
            entries = []
            for index in order[:limit].tolist():
                o, e = rows[index].item(), cols[index].item()
                i, j = divmod(o, out.shape[1])
                position = list(torch.unravel_index(torch.tensor(e), x.shape))
                entries.append(f"d out[{i}][{j}]/d {name}{[p.item() for p in position]}: "
                               f"analytical {analytical[o, e].item():.4g}, "
                               f"numerical {numerical[o, e].item():.4g}")
            problems.append(f"{name}: {int(wrong.sum())} of {wrong.numel()} Jacobian entries "
                            f"wrong, e.g. " + "; ".join(entries))
    return problems


def exercise_forward():
    bias_op = torch.ops.day87.wmma_mm_bias
    # Both a non-square and a square shape: with M != N a bias broadcast along
    # the wrong axis raises; with M == N it silently adds the wrong values.
    for m, k, n in [(3, 4, 5), (5, 4, 5)]:
        a, b, bias = fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64), fresh(n, dtype=torch.float64)
        try:
            c = bias_op(a, b, bias)
        except Exception as error:
            raise Fail(f"{m}x{k}x{n}: the forward raised {type(error).__name__}: {str(error).splitlines()[0]}") from None
        ratio = product_error_ratio(c, a, b, bias)
        require(ratio <= 1.0, f"{m}x{k}x{n}: the forward disagrees with a @ b + bias "
                              f"({ratio:.3g} x the float64 bound)")
    return "agrees with a @ b + bias at 3x4x5 and 5x4x5"


def exercise_gradient():
    # A square output, so that a gradient summed over the wrong axis has the right
    # shape and shows up as wrong Jacobian entries rather than a shape error.
    m, k, n = 4, 3, 4
    inputs = (fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64), fresh(n, dtype=torch.float64))
    problems = jacobian_mismatches(torch.ops.day87.wmma_mm_bias, inputs, ["a", "b", "bias"])
    require(not problems, "\n".join(problems))
    return "gradcheck-style Jacobians agree for a, b and bias"


def exercise_fake():
    a, b, bias = fresh(3, 4, dtype=torch.float64), fresh(4, 5, dtype=torch.float64), fresh(5, dtype=torch.float64)
    try:
        torch.ops.day87.wmma_mm_bias(a, b, bias)
    except Exception as error:
        raise Skip(f"the forward raises at 3x4x5 ({type(error).__name__}), so there is no "
                   "real output to compare the fake with: fix the forward first") from None
    results = torch.library.opcheck(torch.ops.day87.wmma_mm_bias.default, (a, b, bias),
                                    test_utils=("test_schema", "test_faketensor"), raise_exception=False)
    failed = {test: outcome for test, outcome in results.items() if outcome != "SUCCESS"}
    require(not failed, "; ".join(f"{test}: {str(outcome).splitlines()[0]}" for test, outcome in failed.items()))
    return "opcheck test_schema, test_faketensor"


def exercise_cuda_forward(shape):
    require_gpu()
    if not torch._C._dispatch_has_kernel_for_dispatch_key("day87::wmma_mm_bias", "CUDA"):
        raise Skip("wmma_mm_bias has no CUDA implementation")
    return forward_on_gpu(torch.ops.day87.wmma_mm_bias, *shape, bias=True)


def no_exercise_yet():
    raise Skip("no such operator registered yet")


def exercise_rows():
    if not hasattr(torch.ops.day87, "wmma_mm_bias"):
        return [("exercise: wmma_mm_bias", "torch.ops.day87.wmma_mm_bias", no_exercise_yet)]
    return [
        ("exercise: forward", "a @ b + bias (added to every row), cpu f64", exercise_forward),
        ("exercise: gradient", "grad_a, grad_b, grad_bias vs numerical Jacobian", exercise_gradient),
        ("exercise: fake", "fake impl's shape and dtype under opcheck", exercise_fake),
        ("exercise: cuda forward 256x512x384", "f16 in, f32 out vs float64, with bias",
         lambda: exercise_cuda_forward((256, 512, 384))),
        ("exercise: cuda forward 512x1024x128", "f16 in, f32 out vs float64, with bias",
         lambda: exercise_cuda_forward((512, 1024, 128))),
    ]


# ---------------------------------------------------------------------------
# The table
# ---------------------------------------------------------------------------
def lesson_rows():
    mm = op.wmma_mm
    return [
        ("contract, cpu", "calls that must raise, naming their rule", lambda: check_contract_cpu(mm)),
        ("contract, cuda", "calls that must raise, naming their rule", lambda: check_contract_cuda(mm)),
        ("forward 256x512x384", "kernel vs float64 CPU reference", lambda: forward_on_gpu(mm, 256, 512, 384)),
        ("forward 512x1024x128", "kernel vs float64 CPU reference", lambda: forward_on_gpu(mm, 512, 1024, 128)),
        ("opcheck, cpu f64", "schema, fake impl, autograd registration", lambda: check_opcheck("cpu")),
        ("opcheck, cuda f16", "schema, fake impl, autograd registration", lambda: check_opcheck("cuda")),
        ("gradcheck", "registered formula vs numerical Jacobian", lambda: check_gradcheck(mm)),
        ("gradcheck rejects", "a grad_a scaled by 1.01 must raise", check_gradcheck_rejects),
        *exercise_rows(),
        ("autograd, cpu f64", "grads before and after the op vs float64", lambda: check_autograd_chain(mm, "cpu")),
        ("autograd, cuda f16", "grads before and after the op vs float64", lambda: check_autograd_chain(mm, "cuda")),
        ("torch.compile, cpu f64", "fullgraph fwd+bwd, static+dynamic, vs eager", lambda: check_compile(mm, "cpu")),
        ("torch.compile, cuda f16", "fullgraph fwd+bwd, static+dynamic, vs eager", lambda: check_compile(mm, "cuda")),
        ("stream order", "inputs written late on a side stream", lambda: check_stream_order(mm)),
        ("CUDA graph", "captured once, replayed on new values", lambda: check_cuda_graph(mm)),
        ("profiler", "day87::wmma_mm with its kernel under it", lambda: check_profiler(mm)),
        ("no host sync", "fwd+bwd under sync debug mode 'error'", lambda: check_no_host_sync(mm)),
        ("device guard", "call on cuda:1 from current device 0", lambda: check_device_guard(mm)),
    ]


def print_provenance():
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")
    print(f"python {platform.python_version()}, torch {torch.__version__}, "
          f"built for CUDA {torch.version.cuda}")
    print(f"torch.cuda.get_arch_list(): {torch.cuda.get_arch_list()}")
    cuda_home = op.find_cuda_home()
    print("nvcc --version:" + ("\n    " + op.nvcc_version_text(cuda_home).replace("\n", "\n    ")
                               if cuda_home else " not found"))
    if torch.cuda.is_available():
        for index in range(torch.cuda.device_count()):
            major, minor = torch.cuda.get_device_capability(index)
            print(f"device {index}: {torch.cuda.get_device_name(index)}, capability {major}.{minor}")
    else:
        print("device: no GPU visible")
    built = op.BUILD
    print(f"extension: {'CUDA + CPU' if built['with_cuda'] else 'CPU only'}, "
          f"architectures {built['archs']}, in {built['directory']}")
    print()


# ---------------------------------------------------------------------------
# --self-test: the checks against deliberately wrong variants
# ---------------------------------------------------------------------------
def wrong_variants():
    """Operators that return the right numbers (or nearly) and break one promise each."""
    library = torch.library.Library("day87_wrong", "DEF")
    library.define("no_fake(Tensor a, Tensor b) -> Tensor")
    library.define("no_autograd(Tensor a, Tensor b) -> Tensor")
    def opaque_kernel(a, b):
        # Like a C++ kernel, invisible to autograd: without no_grad, autograd
        # would record the inner wmma_mm call and differentiate through it.
        with torch.no_grad():
            return torch.ops.day87.wmma_mm(a, b)

    for name in ("no_fake", "no_autograd"):
        for device in ("CPU", "CUDA"):  # per-device kernels, as binding.cpp registers
            library.impl(name, opaque_kernel, device)
    # Band 1 of the lesson's diagram plus autograd: eager and backward work, the compiler cannot trace.
    torch.library.register_autograd("day87_wrong::no_fake", op._backward,
                                    setup_context=op._setup_context, lib=library)
    # Band 2: the compiler can trace it, backward finds no formula.
    torch.library.register_fake("day87_wrong::no_autograd", op._fake, lib=library)

    def copies_silently(a, b):  # what a library operator does: a hidden .contiguous()
        return torch.ops.day87.wmma_mm(a.contiguous(), b.contiguous())

    def drops_last_k_step(a, b):  # an off-by-one in the K loop
        return torch.ops.day87.wmma_mm(a[:, :-16].contiguous(), b[:-16].contiguous())

    def on_default_stream(a, b):  # ignores the caller's stream
        with torch.cuda.stream(torch.cuda.default_stream(a.device)):
            return torch.ops.day87.wmma_mm(a, b)

    def checks_for_nan(a, b):  # a helpful check that reads a value back to the host
        c = torch.ops.day87.wmma_mm(a, b)
        if not torch.isfinite(c).all():
            raise RuntimeError("NaN in output")
        return c

    def plain_matmul(a, b):  # right numbers, but not the registered operator
        return torch.mm(a.float(), b.float()) if a.is_cuda else torch.mm(a, b)

    return library, {
        "copies non-contiguous inputs": copies_silently,
        "drops the last K step": drops_last_k_step,
        "no fake registered": torch.ops.day87_wrong.no_fake,
        "no backward registered": torch.ops.day87_wrong.no_autograd,
        "launches on the default stream": on_default_stream,
        "reads the output back (sync)": checks_for_nan,
        "plain torch.mm": plain_matmul,
    }


def prove_rows():
    library, variants = wrong_variants()
    cases = [
        ("contract, cpu", lambda mm: check_contract_cpu(mm), "copies non-contiguous inputs"),
        ("contract, cuda", lambda mm: check_contract_cuda(mm), "copies non-contiguous inputs"),
        ("forward 256x512x384", lambda mm: forward_on_gpu(mm, 256, 512, 384), "drops the last K step"),
        ("autograd, cpu f64", lambda mm: check_autograd_chain(mm, "cpu"), "no backward registered"),
        ("autograd, cuda f16", lambda mm: check_autograd_chain(mm, "cuda"), "no backward registered"),
        ("torch.compile, cpu f64", lambda mm: check_compile(mm, "cpu"), "no fake registered"),
        ("torch.compile, cuda f16", lambda mm: check_compile(mm, "cuda"), "no fake registered"),
        ("stream order", check_stream_order, "launches on the default stream"),
        ("profiler", check_profiler, "plain torch.mm"),
        ("no host sync", check_no_host_sync, "reads the output back (sync)"),
        # Last: a capture that fails midway leaves the CUDA generator in capture
        # state, and every later torch.randn on the GPU in this process raises.
        ("CUDA graph", check_cuda_graph, "reads the output back (sync)"),
    ]
    rows = []
    for row, check, variant in cases:
        # `library` rides along in each closure: the wrong operators live only as
        # long as the Library object that registered them.
        def caught(check=check, variant=variant, library=library):
            try:
                with warnings.catch_warnings():  # the variants' own deprecation warnings
                    warnings.simplefilter("ignore")
                    check(variants[variant])
            except Skip:
                raise
            except Exception as error:  # Fail, or the variant's own error: caught either way
                return f"caught: {str(error).splitlines()[0][:110]}"
            raise Fail(f"the row passed against the wrong variant '{variant}'")

        rows.append((f"{row}", f"must fail: {variant}", caught))
    def fuzz_catches(variant="copies non-contiguous inputs", calls=300):
        devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and op.BUILD["with_cuda"] else [])
        failures = [problem for index in range(calls)
                    for status, problem in [fuzz_one(87, index, devices, variants[variant])] if problem]
        require(failures, f"{calls} fuzz calls found nothing wrong with '{variant}'")
        return f"caught: {len(failures)} of {calls} calls, e.g. {failures[0][:80]}"

    rows.insert(-1, ("fuzz, 300 calls", "must fail: copies non-contiguous inputs", fuzz_catches))
    # The gradcheck row's proof is the table's own 'gradcheck rejects' row.
    rows.append(("gradcheck", "must fail: grad_a scaled by 1.01", check_gradcheck_rejects))
    return rows


# Registrations of day87::wmma_mm_bias for the exercise grader's self-test:
# (forward, grad_bias, fake, expected failing questions). A forward or
# backward entry of None leaves that piece unregistered.
def _mm(a, b):
    return torch.ops.day87.wmma_mm(a, b)


def _correct_fake(a, b, bias):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=op.accumulate_dtype(a.dtype))


EXERCISE_CASES = {
    "correct reference": (lambda a, b, bias: _mm(a, b) + bias,
                          lambda grad: grad.sum(0), _correct_fake, set()),
    # Wrong in matching ways: the backward agrees with the wrong forward, so only
    # the forward question can catch it (the lesson's last pitfall).
    "bias broadcast along rows": (lambda a, b, bias: _mm(a, b) + bias.unsqueeze(1),
                                  lambda grad: grad.sum(1), _correct_fake, {"forward", "cuda forward"}),
    "grad_bias over the wrong axis": (lambda a, b, bias: _mm(a, b) + bias,
                                      lambda grad: grad.sum(1), _correct_fake, {"gradient"}),
    "grad_bias scaled (mean)": (lambda a, b, bias: _mm(a, b) + bias,
                                lambda grad: grad.mean(0), _correct_fake, {"gradient"}),
    "fake with the wrong shape": (lambda a, b, bias: _mm(a, b) + bias, lambda grad: grad.sum(0),
                                  lambda a, b, bias: a.new_empty(a.shape, dtype=op.accumulate_dtype(a.dtype)),
                                  {"fake"}),
    "fake with the wrong dtype": (lambda a, b, bias: _mm(a, b) + bias, lambda grad: grad.sum(0),
                                  lambda a, b, bias: a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32),
                                  {"fake"}),
    "no backward registered": (lambda a, b, bias: _mm(a, b) + bias, None, _correct_fake, {"gradient"}),
    "backward returns None for bias": (lambda a, b, bias: _mm(a, b) + bias,
                                       lambda grad: None, _correct_fake, {"gradient"}),
}


def register_exercise_case(name):
    forward, grad_bias, fake, _ = EXERCISE_CASES[name]

    def kernel(a, b, bias):
        # Opaque to autograd, as a student's C++ kernel is: the backward must
        # come from the registration, not from autograd tracing these ops.
        with torch.no_grad():
            return forward(a, b, bias)

    library = torch.library.Library("day87", "FRAGMENT")
    library.define("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor")
    library.impl("wmma_mm_bias", kernel, "CPU")
    library.impl("wmma_mm_bias", kernel, "CUDA")
    torch.library.register_fake("day87::wmma_mm_bias", fake, lib=library)
    if grad_bias is not None:
        def setup_context(ctx, inputs, output):
            a, b, _ = inputs
            ctx.save_for_backward(a, b)

        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            grad_a = torch.matmul(grad, b.t().to(grad.dtype)).to(a.dtype)
            grad_b = torch.matmul(a.t().to(grad.dtype), grad).to(b.dtype)
            return grad_a, grad_b, grad_bias(grad)

        torch.library.register_autograd("day87::wmma_mm_bias", backward,
                                        setup_context=setup_context, lib=library)
    return library


QUESTION_OF_ROW = {"exercise: forward": "forward", "exercise: gradient": "gradient",
                   "exercise: fake": "fake", "exercise: cuda forward": "cuda forward"}


def grade_exercise_cases():
    """Run the sixth check once per registration, each in a fresh process (an
    operator cannot be unregistered), print what each run printed, and return
    one row per case comparing its verdict with the expected one."""
    runs = {}
    for name in EXERCISE_CASES:
        runs[name] = subprocess.run([sys.executable, os.path.abspath(__file__), "--exercise-case", name],
                                    capture_output=True, text=True)
        print(f"--- the sixth check, on the registration '{name}':")
        print(runs[name].stdout)

    def graded(name):
        child, expected = runs[name], EXERCISE_CASES[name][-1]
        failed = {question for line in child.stdout.splitlines() for row, question in QUESTION_OF_ROW.items()
                  if line.startswith(row) and " FAIL, " in line}
        if not torch.cuda.is_available():
            expected = expected - {"cuda forward"}
        require(child.returncode == (1 if failed else 0),
                f"exit status {child.returncode}; stderr ends: {child.stderr.strip()[-300:]}")
        require(failed == expected,
                f"failed {sorted(failed) or 'nothing'}, expected {sorted(expected) or 'nothing'}")
        if "gradient" in failed:
            require(re.search(r"d out\[\d+\]\[\d+\]/d \w+\[", child.stdout),
                    "the gradient failure names no Jacobian entries")
        return f"failed {', '.join(sorted(failed)) or 'nothing'}, as expected"

    return [(f"grader: {name}", "the sixth check's verdict", lambda name=name: graded(name))
            for name in EXERCISE_CASES]


# ---------------------------------------------------------------------------
# --fuzz: random calls, valid and invalid
# ---------------------------------------------------------------------------
def broken_rules(a, b):
    """The contract, restated from the lesson: every rule this call breaks."""
    rules = []
    if a.dim() != 2 or b.dim() != 2:
        return ["two matrices"]
    if a.device != b.device:
        rules.append("one device")
    expected_dtype = torch.half if a.is_cuda else torch.float64
    if a.dtype != expected_dtype or b.dtype != expected_dtype:
        rules.append("dtype")
    if not (a.is_contiguous() and b.is_contiguous()):
        rules.append("contiguous")
    if a.shape[1] != b.shape[0]:
        rules.append("inner dimensions")
    if a.is_cuda and b.is_cuda:
        if a.shape[0] % 128 or b.shape[1] % 128 or a.shape[1] % 16:
            rules.append("tile")
        if a.data_ptr() % 16 or b.data_ptr() % 16:
            rules.append("alignment")
    return rules


def draw_call(rng, devices):
    """One random call: (a, b, output gradient or None, description)."""
    device = rng.choice(devices)
    on_cuda = device == "cuda"
    m = rng.choice([0, 128, 256, 384]) if on_cuda else rng.choice([0, 1, 3, 17, 64])
    k = rng.choice([0, 16, 48, 128, 272]) if on_cuda else rng.choice([0, 1, 5, 32])
    n = rng.choice([0, 128, 256]) if on_cuda else rng.choice([0, 1, 4, 33])
    dtype = torch.half if on_cuda else torch.float64
    shape_a, shape_b, notes = [m, k], [k, n], []
    devices_ab = [device, device]
    dtypes_ab = [dtype, dtype]
    # Each perturbation breaks (or, by chance, keeps) one thing a tensor carries.
    if rng.random() < 0.15:
        side = rng.randrange(2)
        dtypes_ab[side] = rng.choice([torch.float16, torch.float32, torch.float64, torch.bfloat16, torch.int32])
        notes.append(f"{'ab'[side]} dtype {dtypes_ab[side]}")
    if rng.random() < 0.1 and len(devices) > 1:
        side = rng.randrange(2)
        devices_ab[side] = rng.choice(devices)
        notes.append(f"{'ab'[side]} on {devices_ab[side]}")
    if rng.random() < 0.15:
        side = rng.randrange(2)
        (shape_a, shape_b)[side][rng.randrange(2)] += rng.choice([-1, 1, 8, 16])
        notes.append(f"{'ab'[side]} size changed")
    ndims = [2, 2]
    if rng.random() < 0.08:
        side = rng.randrange(2)
        ndims[side] = rng.choice([0, 1, 3])
        notes.append(f"{'ab'[side]} {ndims[side]}-D")
    layouts = [rng.choice(["contiguous"] * 6 + ["transposed", "column slice", "row slice",
                                                "expanded", "offset"]) for _ in range(2)]
    tensors = []
    for side in range(2):
        shape = [max(size, 0) for size in (shape_a, shape_b)[side]]
        shape = {0: [], 1: shape[:1], 2: shape, 3: [2] + shape}[ndims[side]]
        tensors.append(make_tensor(shape, dtypes_ab[side], devices_ab[side], layouts[side], rng))
        if layouts[side] != "contiguous":
            notes.append(f"{'ab'[side]} {layouts[side]}")
    a, b = tensors
    if rng.random() < 0.4 and a.dtype.is_floating_point and b.dtype.is_floating_point:
        a.requires_grad_(rng.random() < 0.8)
        b.requires_grad_(rng.random() < 0.8)
        if a.requires_grad or b.requires_grad:
            notes.append("requires_grad")
    return a, b, notes


def make_tensor(shape, dtype, device, layout, rng):
    def values(shape):
        return torch.randn(shape, dtype=torch.float64).to(dtype=dtype, device=device) \
            if dtype.is_floating_point else torch.randint(-3, 4, shape, dtype=dtype, device=device)

    if len(shape) != 2 or layout == "contiguous":
        return values(shape)
    rows, cols = shape
    if layout == "transposed":
        return values([cols, rows]).t()
    if layout == "column slice":
        return values([rows, cols + 16])[:, 16:]
    if layout == "row slice":  # contiguous, 16-byte aligned when cols is a multiple of 8
        return values([rows + 1, cols])[1:]
    if layout == "expanded":
        return values([1, cols]).expand(rows, cols)
    flat = values([rows * cols + 1])  # "offset": contiguous, one element off alignment
    return flat[1:].view(rows, cols)


def fuzz_one(seed, index, devices, mm=op.wmma_mm):
    """Run call `index` of `seed`: returns ("result" or "raised", None) when the
    op kept its contract, or ("fail", a description of what went wrong)."""
    rng = random.Random(f"{seed}:{index}")
    torch.manual_seed(rng.randrange(2**31))
    a, b, notes = draw_call(rng, devices)
    describe = (f"a {tuple(a.shape)} {a.dtype} {a.device} stride {a.stride()}, "
                f"b {tuple(b.shape)} {b.dtype} {b.device} stride {b.stride()} ({', '.join(notes) or 'plain'})")
    broken = broken_rules(a, b)
    try:
        c = mm(a, b)
    except (RuntimeError, ValueError, TypeError) as error:
        if not broken:
            return "fail", f"valid call raised {type(error).__name__}: {str(error).splitlines()[0]} | {describe}"
        if not any(f"'{rule}'" in str(error) for rule in broken):
            return "fail", f"error names none of {broken}: {str(error).splitlines()[0]} | {describe}"
        if a.is_cuda or b.is_cuda:  # after an error the CUDA context must still work
            try:
                forward_on_gpu(mm, 128, 128, 16)
            except Exception as error:
                return "fail", f"CUDA context broken after the error: {error} | {describe}"
        return "raised", None
    if broken:
        return "fail", f"returned a result though it breaks {broken} | {describe}"
    ratio = product_error_ratio(c, a, b)
    if ratio > 1.0:
        return "fail", f"forward error {100 * ratio:.3g}% of bound | {describe}"
    if c.requires_grad:
        grad = torch.randn_like(c)
        c.backward(grad)
        # Each gradient is itself a product, grad @ b^T or a^T @ grad, accumulated
        # in the output dtype and, for FP16 inputs, rounded back to FP16.
        for name, got, left, right in (("grad_a", a.grad, grad, b.t()), ("grad_b", b.grad, a.t(), grad)):
            if got is not None:
                ratio = product_error_ratio(got, left.to(c.dtype), right.to(c.dtype))
                if ratio > 1.0:
                    return "fail", f"{name} error {100 * ratio:.3g}% of bound | {describe}"
    return "result", None


def run_fuzz(count, seed, only_index=None):
    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() and op.BUILD["with_cuda"] else [])
    print(f"fuzz: seed {seed}, {count} calls, devices {devices}", flush=True)
    tally = {"result": 0, "raised": 0, "fail": 0}
    indices = [only_index] if only_index is not None else range(count)
    for index in indices:
        status, problem = fuzz_one(seed, index, devices)
        tally[status] += 1
        if problem:
            print(f"FAIL call {index}: {problem}\n    reproduce: python test_op.py --fuzz-case {seed}:{index}",
                  flush=True)
    print(f"fuzz: {tally['result']} calls returned a result within the bound, {tally['raised']} raised "
          "an error naming a broken rule (each followed by a valid CUDA call where CUDA was involved)")
    print(f"{tally['result'] + tally['raised']} passed, {tally['fail']} failed, 0 skipped")
    return tally["fail"] == 0


def main():
    # A crash in native code prints the Python stack that led to it, not just
    # "Segmentation fault": the harness exists to find such crashes.
    faulthandler.enable()
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--self-test", action="store_true", help="run every check against wrong variants")
    parser.add_argument("--fuzz", type=int, metavar="N", help="N random calls against the contract")
    parser.add_argument("--seed", type=int, default=None, help="the fuzz seed (default: random, printed)")
    parser.add_argument("--fuzz-case", metavar="SEED:INDEX", help="rerun one fuzz call")
    parser.add_argument("--exercise-case", help=argparse.SUPPRESS)  # the self-test's child processes
    args = parser.parse_args()

    if args.exercise_case:
        library = register_exercise_case(args.exercise_case)  # noqa: F841, kept alive
        ok = run_table(exercise_rows())
        sys.exit(0 if ok else 1)
    if args.fuzz_case:
        seed, index = (int(part) for part in args.fuzz_case.split(":"))
        sys.exit(0 if run_fuzz(1, seed, index) else 1)
    if args.fuzz is not None:
        seed = args.seed if args.seed is not None else random.randrange(2**31)
        sys.exit(0 if run_fuzz(args.fuzz, seed) else 1)

    print_provenance()
    if args.self_test:
        print("Each check, run against a deliberately wrong variant, must fail;")
        print("the exercise grader must give each registration the expected verdict.\n")
        ok = run_table(prove_rows() + grade_exercise_cases())
    else:
        ok = run_table(lesson_rows())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
