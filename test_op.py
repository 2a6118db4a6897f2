"""test_op.py: the day 87 harness. A plain script: provenance, then the lesson's table.

    python test_op.py

Each row prints pass, FAIL or skip with its reason; the last line is
"N passed, N failed, N skipped", and the exit status is 1 if anything failed.
Checks 1 to 6 are the lesson's; 7 to 13 prove the rest of what it promises; 14
compiles gate.cu. Without a GPU the CUDA rows skip, the CPU rows still run, and the
line before the last says that the kernel was not run. checks/self_test.py runs
the rows against deliberately wrong operators and requires each to fail;
checks/hardening.py holds what the operator supports beyond the lesson.

Every check takes the operator under test (an Operator, below): the lesson's
day87::wmma_mm unless another is given. Another operator that keeps the same
contract runs this table with main(its Operator).
"""

import argparse
import sys

if __name__ == "__main__":
    # Usage first, so that --help answers before torch loads or anything builds.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import dataclasses  # noqa: E402
import datetime  # noqa: E402
import faulthandler  # noqa: E402
import hashlib  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import pathlib  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import traceback  # noqa: E402
import warnings  # noqa: E402

# torch.compile's on-disk autograd cache can serve a backward compiled before
# op.py's _backward was edited (pytorch/pytorch#144344): test the one there now.
os.environ["TORCHINDUCTOR_AUTOGRAD_CACHE"] = "0"

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException  # noqa: E402
from torch.autograd.gradcheck import GradcheckError  # noqa: E402

import op  # noqa: E402


# ---------------------------------------------------------------------------
# The operator under test
# ---------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Operator:
    """What the table checks, and where a failure's fix goes."""
    wrapper: object      # the Python function users call: a, b -> c
    name: str            # its qualified name, "namespace::wmma_mm": the profiler shows it
    kernel: str          # part of the name of the kernel its forward launches
    build: dict          # what op.load_extension returned for its library
    python_file: str     # the file that registers its fake and backward (op.py's _register)
    bias: object = None  # check 6's operator; None: this namespace's wmma_mm_bias, where registered
    bias_wrapper: object = None  # check 6's Python wrapper, op.wmma_mm_bias; None where there is none
    gradient_bound: object = None  # error_ratio's more_bound for its gradients (row 13); None: the lesson's
    more_rows: tuple = ()  # (name, what it compares, check(operator)) of its own, after row 14

    @property
    def namespace(self):
        return self.name.split("::")[0]

    @property
    def overload(self):  # torch.ops.namespace.wmma_mm.default, for opcheck
        return getattr(getattr(torch.ops, self.namespace), self.name.split("::")[1]).default

    @property
    def bias_op(self):  # the exercise's operator, or None where there is none yet
        return self.bias or getattr(getattr(torch.ops, self.namespace), "wmma_mm_bias", None)

    @property
    def python_name(self):  # "op.py": where a student looks for _register
        return os.path.basename(self.python_file)

    @property
    def folder(self):
        return os.path.dirname(os.path.abspath(self.python_file))

    def with_wrapper(self, wrapper):  # the same operator called through another function
        return dataclasses.replace(self, wrapper=wrapper)


LESSON = Operator(wrapper=op.wmma_mm, name="day87::wmma_mm", kernel="wmmaGemmKernel", build=op.BUILD,
                  python_file=op.__file__, bias_wrapper=getattr(op, "wmma_mm_bias", None))


# ---------------------------------------------------------------------------
# The table. A check returns its row's detail, or raises Skip(why) or Fail(what).
# ---------------------------------------------------------------------------
class Skip(Exception):
    """The row cannot run here; the message says why."""


class Fail(Exception):
    """The row ran and found a defect; the message says which."""


def require(condition, message):
    if not condition:
        raise Fail(message)


def run_table(rows, notes=()):
    """Print one row per (name, what it compares, check), then the notes, then
    the closing line; returns True when nothing failed."""
    print(f"{'check':<42}{'what it compares':<52}result")
    counts = {"pass": 0, "FAIL": 0, "skip": 0}
    for name, compares, check in rows:
        try:
            status, detail = "pass", check()
        except Skip as reason:
            status, detail = "skip", str(reason)
        except Fail as defect:
            status, detail = "FAIL", str(defect)
        except Exception as error:  # a crash inside a check is a failure, with its cause
            status, detail = "FAIL", f"{type(error).__name__}: {error}"
        if status == "FAIL" and not BROKEN_CONTEXT and any(sticky in str(detail) for sticky in STICKY_CUDA_ERRORS):
            BROKEN_CONTEXT.append(name)
            detail = f"{str(detail).splitlines()[0]}\n{BROKEN_CONTEXT_HINT}"
        counts[status] += 1
        first, *rest = str(detail).splitlines() or [""]
        print(f"{name:<42}{compares:<52}{status}, {first}", flush=True)
        for line in rest:
            print(f"    {line}", flush=True)
    for note in notes:
        print(note)
    print(f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped")
    return counts["FAIL"] == 0


def why_no_kernel(operator=LESSON):
    """Why the operator's CUDA kernel cannot run here, or None when it can."""
    if not torch.cuda.is_available():
        return "no GPU visible"
    if not operator.build["with_cuda"]:
        return "the extension was built without its CUDA part"
    return None


# A kernel that faults (reads or writes outside its buffers) leaves the CUDA context
# of the whole process broken: every later CUDA call fails with the same error.
STICKY_CUDA_ERRORS = ("illegal memory access", "misaligned address", "unspecified launch failure",
                      "illegal instruction", "device-side assert")
BROKEN_CONTEXT = []  # the name of the row whose kernel faulted, once one has
BROKEN_CONTEXT_HINT = (
    "A kernel read or wrote outside its buffers, and the CUDA context of this process is now broken: "
    "the later CUDA rows cannot run. Doing the exercise? wmma_mm passes no bias (a null pointer): "
    "the kernel may read the bias only where one is given.")


def require_gpu(operator, count=1):
    if why_no_kernel(operator):
        raise Skip(why_no_kernel(operator))
    if BROKEN_CONTEXT:
        raise Fail(f"not run: a kernel in row '{BROKEN_CONTEXT[0]}' faulted and broke the CUDA context; fix that first")
    if torch.cuda.device_count() < count:
        raise Skip(f"needs {count} GPUs")


# ---------------------------------------------------------------------------
# References and the error bound
# ---------------------------------------------------------------------------
def fresh(*shape, dtype, device="cpu", requires_grad=False):
    """Fresh standard-normal values, never zeros."""
    tensor = torch.randn(*shape, dtype=torch.float64).to(device=device, dtype=dtype)
    return tensor.requires_grad_(requires_grad)


def error_ratio(result, a, b, extra=None, more_bound=None):
    """Worst |result - reference| / bound over all elements, in float64: 1.0 is the
    edge. The reference is a @ b (+ extra) in float64 from the same values.

    The bound, derived here once (README.md, gate.cu and checks/ point to it):
    FP16 x FP16 products are exact in FP32 (11 + 11 significand bits fit in 24),
    so all error comes from adding K products in FP32: in any order, with
    round-to-nearest, |error| <= (K - 1) * 2^-24 * sum_p |a_ip b_pj|. Tensor cores
    may truncate rather than round, so allow 2^-23 per addition:
        bound_ij = K * 2^-23 * (|A| @ |B|)_ij        (float64: 2^-51 per addition)
    A result stored in FP16 (a gradient) is rounded once more: half an FP16 ulp,
    2^-11 relative, or 2^-25 absolute where it is subnormal. more_bound(a64, b64,
    magnitude): another operator's own allowance on top (fast/ rounds its inputs)."""
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
    bound = (a.shape[1] + (extra is not None)) * unit * magnitude + torch.finfo(torch.float64).tiny
    if more_bound is not None:
        bound = bound + more_bound(a64, b64, magnitude)
    if result.dtype == torch.half:
        bound += 2.0**-11 * reference.abs() + 2.0**-25
    return ((result64 - reference).abs() / bound).max().item()


def jacobian_mismatches(fn, inputs, names, epsilon=1e-6):
    """As gradcheck: the Jacobians through the backward against central differences,
    at float64 inputs. One line per input that disagrees, with its first wrong entries."""
    analytical = torch.autograd.functional.jacobian(lambda *x: fn(*x).reshape(-1), tuple(inputs))
    problems, columns = [], fn(*inputs).shape[1]
    for which, (x, name) in enumerate(zip(inputs, names)):
        def at(step):  # fn with x moved by `step`
            return fn(*inputs[:which], x + step, *inputs[which + 1:]).reshape(-1)

        steps = epsilon * torch.eye(x.numel(), dtype=x.dtype).view(-1, *x.shape)  # one element at a time
        numerical = torch.stack([(at(step) - at(-step)) / (2 * epsilon) for step in steps], dim=1)
        backward = analytical[which].reshape(numerical.shape)
        wrong = ((backward - numerical).abs() > 1e-5 + 1e-3 * numerical.abs()).nonzero().tolist()
        index = (lambda e: list(divmod(e, x.shape[1]))) if x.dim() == 2 else (lambda e: [e])  # noqa: E731
        entries = [f"d out[{o // columns}][{o % columns}]/d {name}{index(e)}: "
                   f"analytical {backward[o, e]:.4g}, numerical {numerical[o, e]:.4g}" for o, e in wrong[:3]]
        if wrong:
            problems.append(f"{name}: {len(wrong)} of {backward.numel()} Jacobian entries wrong, e.g. "
                            + "; ".join(entries))
    return problems


# ---------------------------------------------------------------------------
# The checks, in the table's order. Each takes the Operator it checks, so that
# checks/self_test.py can hand it a deliberately wrong one and watch it fail.
# ---------------------------------------------------------------------------
def expect_raise(mm, a, b, rule):
    """The call must raise an error that names `rule`; returns the message."""
    try:
        mm(a, b)
    except (RuntimeError, ValueError, TypeError) as error:
        require(f"'{rule}'" in str(error),
                f"rule '{rule}': raised, but the message does not name it: {error}")
        return str(error)
    raise Fail(f"rule '{rule}': the call returned instead of raising (a: {describe(a)}; b: {describe(b)})")


def describe(t):
    return f"{tuple(t.shape)} {t.dtype} {t.device}, strides {t.stride()}" if torch.is_tensor(t) else repr(t)


def contract_calls(device):
    """Calls that break one rule each: (a, b, the rule)."""
    if device == "cpu":
        f64 = torch.float64
        return [(fresh(4, 3, dtype=torch.float32), fresh(3, 5, dtype=torch.float32), "dtype"),
                (fresh(4, 3, dtype=f64), fresh(3, dtype=f64), "two matrices"),
                (None, fresh(3, 5, dtype=f64), "two matrices"),
                (fresh(4, 3, dtype=f64), fresh(7, 5, dtype=f64), "inner dimensions"),
                (fresh(4, 3, dtype=f64), fresh(5, 3, dtype=f64).t(), "contiguous")]
    half, gpu, flat = torch.half, "cuda", fresh(128 * 16 + 1, dtype=torch.half, device="cuda")
    return [(fresh(128, 16, dtype=torch.float32, device=gpu), fresh(16, 128, dtype=torch.float32, device=gpu), "dtype"),
            (fresh(128, 16, dtype=half, device=gpu), fresh(16, 128, dtype=half), "one device"),
            (fresh(128, 16, dtype=half, device=gpu), fresh(128, 16, dtype=half, device=gpu).t(), "contiguous"),
            (fresh(100, 16, dtype=half, device=gpu), fresh(16, 128, dtype=half, device=gpu), "tile"),
            (flat[1:].view(128, 16), fresh(16, 128, dtype=half, device=gpu), "alignment")]


def check_contract(operator, device):
    """Failure modes: a rule that is not checked returns garbage (a transposed view
    read row-major) or faults (a misaligned 16-byte copy): a return, not a raise."""
    if device == "cuda":
        require_gpu(operator)
    calls = contract_calls(device)
    for a, b, rule in calls:
        expect_raise(operator.wrapper, a, b, rule)
    if device == "cuda":  # after the errors, the CUDA context must still work
        forward_on_gpu(operator.wrapper, op.TILE_M, op.TILE_N, op.TILE_K)
    return f"{len(calls)} calls raised, each naming its rule" + (
        "; a valid call still works" if device == "cuda" else "")


def check_forward(operator, m, n, k):
    require_gpu(operator)
    return forward_on_gpu(operator.wrapper, m, n, k)


def forward_on_gpu(mm, m, n, k, bias=False):
    """mm on fresh FP16 inputs against float64; returns the % of the bound used.
    The caller has checked that a GPU is there (require_gpu)."""
    a, b = fresh(m, k, dtype=torch.half, device="cuda"), fresh(k, n, dtype=torch.half, device="cuda")
    extra = fresh(n, dtype=torch.float32, device="cuda") if bias else None
    # Freed NaNs of the output's size: the caching allocator hands the operator
    # this memory, so an element the kernel never writes stays NaN.
    torch.full((m, n), math.nan, dtype=torch.float32, device="cuda")
    c = mm(a, b) if extra is None else mm(a, b, extra)
    torch.cuda.synchronize()
    require(c.dtype == torch.float32 and c.device == a.device,
            f"output is {c.dtype} on {c.device}, expected torch.float32 on {a.device}")
    problem = forward_problem(c, a, b, extra, f"{m}x{n}x{k}")
    require(problem is None, problem)
    return f"{100 * error_ratio(c, a, b, extra):.1f}% of bound"


def forward_problem(c, a, b, bias, shape):
    """None where c is a @ b (+ bias) within the bound; else the error and the worst
    entry, and with a bias what c equals where check 6 knows the form."""
    ratio = error_ratio(c, a, b, bias)
    if ratio <= 1.0:
        return None
    expected = a.detach().double().cpu() @ b.detach().double().cpu()
    expected = expected if bias is None else expected + bias.detach().double().cpu()
    i, j = divmod(((c.detach().double().cpu() - expected).abs() / (expected.abs() + 1)).argmax().item(), c.shape[1])
    equals = "" if bias is None else f"the output is {what_the_output_equals(c, a, b, bias)}; "
    return (f"{shape}: {equals}error is {100 * ratio:.3g}% of the bound; "
            f"out[{i}][{j}] = {c[i, j].item():.6g}, expected {expected[i, j]:.6g}")


def check_opcheck(operator, device):
    if device == "cuda":
        require_gpu(operator)
        a, b = fresh(128, 32, dtype=torch.half, device="cuda"), fresh(32, 256, dtype=torch.half, device="cuda")
    else:
        a, b = fresh(4, 3, dtype=torch.float64), fresh(3, 5, dtype=torch.float64)
    a.requires_grad_(), b.requires_grad_()
    results = torch.library.opcheck(operator.overload, (a, b), raise_exception=False)
    failed = {test: outcome for test, outcome in results.items() if outcome != "SUCCESS"}
    require(not failed, f"opcheck failed: {failed}")
    return ", ".join(sorted(results))


def check_gradcheck(operator):
    a, b = fresh(4, 3, dtype=torch.float64, requires_grad=True), fresh(3, 5, dtype=torch.float64, requires_grad=True)
    try:
        torch.autograd.gradcheck(operator.wrapper, (a, b))
    except GradcheckError as error:  # with the entries that disagree
        raise Fail("\n".join([f"gradcheck: {str(error).splitlines()[0]}"]
                             + jacobian_mismatches(operator.wrapper, (a, b), ["a", "b"]))) from None
    return "analytical and numerical Jacobians agree"


def wrong_grad_a(operator):
    """The operator through the older autograd.Function recipe, with a formula that
    is wrong by 1%."""
    class WrongGradA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return operator.overload(a, b)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return 1.01 * (grad @ b.t()), a.t() @ grad

    return WrongGradA.apply


def check_gradcheck_rejects(operator):
    try:
        check_gradcheck(operator.with_wrapper(wrong_grad_a(operator)))
    except Fail:
        return "GradcheckError raised for grad_a scaled by 1.01"
    raise Fail("gradcheck accepted a grad_a scaled by 1.01: it would accept anything")


# ---------------------------------------------------------------------------
# Check 6: the exercise, wmma_mm_bias
# ---------------------------------------------------------------------------
def exercise_rows(operator=LESSON):
    """Check 6 grades operator.bias_op (this namespace's wmma_mm_bias, or checks/self_test.py's
    wrong ones); one row skips until there is one. The lesson's three questions in float64
    on the CPU: the forward against a @ b + bias at M != N and M == N (a bias along the
    wrong axis raises at one, adds wrong values at the other); the gradient (a backward
    registered, Jacobians against central differences, and grad_bias as the backward
    returns it for one random grad against float64: gradcheck's one-hot grads round
    exactly in FP16); the fake's shape and dtype. Beside them: the wrapper and schema;
    each bias the README says to refuse, refused naming the bias on the CPU, under the
    fake and by the CUDA implementation (calls that can fault in child processes); on a
    GPU, the kernel with a bias and the gradients through it. A failing row says what it
    saw and where, and which hint applies; no row states the gradient's formula."""
    bias_op = operator.bias_op
    if bias_op is None:
        return [("6 exercise: wmma_mm_bias", f"torch.ops.{operator.namespace}.wmma_mm_bias", no_exercise_yet)]
    return [(name, compares, lambda check=check: check(operator, bias_op)) for name, compares, check in (
        ("6 exercise: forward", "a @ b + bias, cpu f64, M != N and M == N", exercise_forward),
        ("6 exercise: gradient", "registered; Jacobians; grad_bias vs float64", exercise_gradient),
        ("6 exercise: fake", "shape, dtype: fake cuda f16, cpu f64", exercise_fake),
        ("6 exercise: wrapper", "op.wmma_mm_bias; schema (a, b, bias)", exercise_wrapper),
        ("6 exercise: contract", "bad biases refused: cpu, fake, cuda", exercise_contract),
        ("6 exercise: cuda forward", "both lesson shapes, f16 in, f32 out vs float64", exercise_cuda_forward),
        ("6 exercise: cuda gradient", "grads of a, b, bias through the kernel vs f64", exercise_cuda_gradient),
    )]


def no_exercise_yet():
    raise Skip("no such operator registered yet")


HINT = "Hint {} in README.md's exercise applies."
NO_FAKE = ("no fake implementation is registered for {name}: torch.compile splits the graph there (the "
           "lesson's pitfall 'torch.compile gets slower'); {file}'s _register needs register_fake")


def raised(operator, what, error, hint=""):
    """A failure for an exception: its type, first line, and its innermost line in the operator's folder."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if os.path.dirname(os.path.abspath(frame.filename)) == operator.folder
              and os.path.abspath(frame.filename) != os.path.abspath(__file__)]
    where = f" at {os.path.basename(frames[-1].filename)}:{frames[-1].lineno}, in {frames[-1].name}" if frames else ""
    return Fail(f"{what} raised {type(error).__name__}{where}: {(str(error).splitlines() or [''])[0][:300]}"
                + (f"\n{hint}" if hint else ""))


def what_the_output_equals(c, a, b, bias):
    """For a wrong forward with a bias: what c equals, where it is a likely kernel mistake."""
    within = lambda extra: error_ratio(c, a, b, extra) <= 1.0  # noqa: E731
    bias64 = bias.detach().double().cpu()
    offset = c.detach().double().cpu() - a.detach().double().cpu() @ b.detach().double().cpu()
    times = round((offset.mean(0) @ bias64 / (bias64 @ bias64)).nan_to_num().item())
    if not torch.isfinite(offset).all():
        return "not finite: NaN or inf, an element unwritten or read from beyond the bias"
    if within(torch.zeros_like(bias64)):
        return "a @ b: the bias is missing"
    if times >= 2 and within(times * bias64):
        steps = f"; K = {a.shape[1]} is {times} steps of {a.shape[1] // times}" if times > 2 else ""
        return f"a @ b + {times} * bias: the bias is added {times} times{steps}"
    if c.shape[0] <= bias64.shape[0] and within(bias64[:c.shape[0]].unsqueeze(1)):
        return "a @ b with bias[i] added to row i: the bias is indexed by the output's row"
    read = [(bias64 - value).abs().argmin().item() for value in offset[0]]  # one value per column, other ones
    if within(offset[0]) and within(bias64[read]):
        return "a @ b + a bias read from other columns: " + ", ".join(
            f"column {j} got bias[{i}]" for j, i in enumerate(read) if i != j)[:160]
    return "not a @ b + bias"


def exercise_forward(operator, bias_op):
    for m, k, n in [(3, 4, 5), (5, 4, 5)]:
        a, b, bias = fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64), fresh(n, dtype=torch.float64)
        try:
            c = bias_op(a, b, bias)
        except NotImplementedError as error:  # the dispatcher found no CPU kernel
            raise raised(operator, f"{m}x{k}x{n}: the forward", error, "No CPU implementation: binding.cpp's "
                         "TORCH_LIBRARY_IMPL(day87, CPU, m) needs an m.impl spelt as in the schema.") from None
        except Exception as error:  # Hint 1 where the bias did not broadcast
            broadcast = re.search(r"size of (the )?tensor|expanded size|shape|broadcast", str(error))
            raise raised(operator, f"{m}x{k}x{n}: the forward", error, broadcast and HINT.format(1)) from None
        problem = forward_problem(c, a, b, bias, f"{m}x{k}x{n}")  # error_ratio names a wrong shape
        require(problem is None, f"{problem}\n{HINT.format(1)}" if "the output's row" in str(problem) else problem)
    return "a @ b + bias at 3x4x5 and 5x4x5"


def bias_gradient_problem(bias_op):
    """grad_bias for a random grad at 6x3x4 as the backward returns it (autograd would sum a
    larger one to the bias's shape) against float64 addmm: None where it agrees."""
    a, b, grad, bias = (fresh(*shape, dtype=torch.float64) for shape in ((6, 3), (3, 4), (6, 4), (4,)))
    (m, n), bias = grad.shape, bias.requires_grad_()
    try:
        out = bias_op(a, b, bias)
    except Exception:  # a forward that cannot run at M != N: the forward row names it
        return None
    got = out.grad_fn.apply(grad)[2]  # the registered backward's own gradient for the bias
    if got is None:
        return f"grad_bias is None: the backward returns no gradient for the bias. {HINT.format(2)}"
    if tuple(got.shape) != (n,):
        return f"grad_bias has shape {list(got.shape)} for a bias of shape [{n}], from a {m}x{n} grad. " + HINT.format(1)
    wide = bias.detach().clone().requires_grad_()
    expected, scale = (torch.autograd.grad(torch.addmm(wide, a, b), wide, g)[0] for g in (grad, grad.abs()))
    error = ((got.double() - expected).abs() / scale).max().item()
    if error <= 2.0**-20:  # float32's rounding (2^-24) passes; FP16's (2^-11) does not
        return None
    if error <= 2.0**-10:
        return (f"grad_bias agrees with float64 only to {error:.1e} of its scale, FP16's precision (2^-11 = "
                "4.9e-04): it passed through FP16 (autograd casts it back to the bias's dtype), where a value "
                "past 65504 is inf. Keep it in grad's dtype.")
    entries = "; ".join(f"grad_bias[{j}]: got {got[j].item():.6g}, expected {expected[j].item():.6g}" for j in range(n))
    return f"from a {m}x{n} grad, {entries}. {HINT.format(2)}"


def exercise_gradient(operator, bias_op):
    inputs = [t.requires_grad_() for t in forward_or_skip(bias_op)[:3]]
    registration = torch.library.opcheck(bias_op.default, tuple(inputs), raise_exception=False,
                                         test_utils=("test_autograd_registration",))["test_autograd_registration"]
    require(registration == "SUCCESS",
            f"no backward is registered for {bias_op._qualified_op_name}: on the CPU autograd records the float64 "
            "kernel's own ATen ops and only warns; on CUDA the gradients stay None (the lesson's pitfall 'training "
            f"runs, but the loss does not move'); {operator.python_name}'s _register needs register_autograd")
    # Square (4x3x4), so that a gradient of the wrong shape shows as entries.
    square = (fresh(4, 3, dtype=torch.float64), fresh(3, 4, dtype=torch.float64), fresh(4, dtype=torch.float64))
    try:
        problems = [problem for problem in [bias_gradient_problem(bias_op)] if problem]
        problems += jacobian_mismatches(bias_op, square, ["a", "b", "bias"])
    except Exception as error:  # the hint where saves and unpacking disagree
        unpacked = re.search(r"unpack|cannot be multiplied|NoneType", str(error))
        raise raised(operator, "the backward (or its setup_context)", error, unpacked and "The tensors "
                     "setup_context saves must be the ones the backward unpacks, as many, in the same order.") from None
    require(not problems, "\n".join(problems))
    return "registered; Jacobians of a, b, bias agree; grad_bias to float64's precision"


def exercise_fake(operator, bias_op):
    # Fake CUDA tensors, no GPU needed: on the CPU a fake that returns the input's dtype passes.
    m, k, n = 2 * op.TILE_M, 3 * op.TILE_K, 3 * op.TILE_N
    seen = f"fake CUDA tensors ({m}x{k} @ {k}x{n} torch.float16, bias {n} torch.float32)"
    try:
        with FakeTensorMode():
            out = bias_op(torch.empty(m, k, dtype=torch.half, device="cuda"),
                          torch.empty(k, n, dtype=torch.half, device="cuda"), torch.empty(n, device="cuda"))
    except UnsupportedOperatorException:
        raise Fail(NO_FAKE.format(name=bias_op._qualified_op_name, file=operator.python_name)) from None
    except Exception as error:
        raise raised(operator, f"the fake, on {seen},", error) from None
    require(tuple(out.shape) == (m, n) and out.dtype == torch.float32,
            f"on {seen} the fake gives {'x'.join(map(str, out.shape))} {out.dtype}; the kernel writes {m}x{n} "
            "torch.float32 (accumulate_dtype)")
    results = torch.library.opcheck(bias_op.default, forward_or_skip(bias_op)[:3],
                                    test_utils=("test_schema", "test_faketensor"), raise_exception=False)
    failed = [f"{test}: {str(result).splitlines()[0][:200]}" for test, result in results.items() if result != "SUCCESS"]
    require(not failed, "cpu f64: " + "; ".join(failed))
    return "fake cuda f16 in, f32 out; opcheck test_schema, test_faketensor"


def forward_or_skip(bias_op):
    """Inputs at 3x4x5 and the output; a skip where the forward raises (the forward row says where)."""
    a, b, bias = fresh(3, 4, dtype=torch.float64), fresh(4, 5, dtype=torch.float64), fresh(5, dtype=torch.float64)
    try:
        return a, b, bias, bias_op(a, b, bias)
    except Exception as error:
        raise Skip(f"the forward raises at 3x4x5 ({type(error).__name__}): the forward row says where") from None


def exercise_wrapper(operator, bias_op):
    arguments = [argument.name for argument in bias_op.default._schema.arguments]
    require(arguments == ["a", "b", "bias"], f"the schema's arguments are ({', '.join(arguments)}), expected "
                                             "(a, b, bias): a call by keyword reaches the wrong ones")
    wrapper = operator.bias_wrapper
    require(wrapper is not None, f"{operator.python_name} has no wmma_mm_bias(a, b, bias) beside wmma_mm: "
                                 "the tools and day 88 call it")
    a, b, bias, expected = forward_or_skip(bias_op)
    try:
        wrapped = wrapper(a, b, bias)
    except Exception as error:
        raise raised(operator, "the wrapper at 3x4x5", error) from None
    require(torch.is_tensor(wrapped) and torch.equal(wrapped, expected),
            f"{operator.python_name}'s wmma_mm_bias(a, b, bias) gives {describe(wrapped)}, which is not "
            f"{bias_op._qualified_op_name}(a, b, bias)")
    return f"{operator.python_name}'s wmma_mm_bias agrees; schema (a, b, bias)"


# Calls whose missing check would hand the kernel memory it cannot read: each runs
# in a child process, where a fault cannot break this process's CUDA context.
FAULTING_CALLS = {"a CPU bias beside CUDA a and b": ("cuda", "float16", "cpu"),
                  "a CUDA bias beside CPU a and b in float64": ("cpu", "float64", "cuda"),
                  "a CUDA bias beside CPU a and b in float16": ("cpu", "float16", "cuda")}
CHILD_CALL = """
import os, runpy, sys, torch
path, name, device, dtype, bias_device = sys.argv[1:]
sys.path.insert(0, os.path.dirname(path))  # what the operator's file imports beside it
registrations = runpy.run_path(path, run_name="day87_refusal_child")  # loads and registers the operator
a, b = (torch.randn(*shape, device=device).to(getattr(torch, dtype)) for shape in ((256, 32), (32, 128)))
try:
    getattr(getattr(torch.ops, name.split("::")[0]), name.split("::")[1])(a, b, torch.randn(128, device=bias_device))
except Exception as error:
    sys.exit(print("raised", (str(error).splitlines() or [""])[0][:300]))
torch.cuda.synchronize()  # a fault surfaces here, or the process dies
print("returned")
"""


def exercise_contract(operator, bias_op):
    def named(what, said):  # the bias by name, outside the operator's own name (which has it too)
        words = said.replace(bias_op._qualified_op_name, "").replace("wmma_mm_bias", "")
        return None if re.search(r"\bbias\b", words) else f"{what}: raised, but not naming the bias: {said[:200]}"

    def ask(what, a, b, bias, right=None):  # in this process; right(c): a right answer may stand for a refusal
        try:
            c = bias_op(a, b, bias)
        except UnsupportedOperatorException:
            raise Fail(NO_FAKE.format(name=bias_op._qualified_op_name, file=operator.python_name)) from None
        except Exception as error:
            return named(what, (str(error).splitlines() or [""])[0])
        wrong = "a wrong answer " if right else ""
        return None if right and right(c) else f"{what}: the call returned {wrong}instead of raising"

    forward_or_skip(bias_op)
    m, k, n, problems = 256, 2 * op.TILE_K, op.TILE_N, []
    for device, dtype, bias_dtype, other in [("cpu", torch.float64, torch.float64, torch.float32)] + (
            [] if why_no_kernel(operator) else [("cuda", torch.half, torch.float32, torch.float64)]):
        a, b = fresh(m, k, dtype=dtype, device=device), fresh(k, n, dtype=dtype, device=device)
        strided = fresh(2 * n, dtype=bias_dtype, device=device)[::2]
        problems += [ask(f"a bias of length N + 1 = {n + 1} ({device})", a, b,
                         fresh(n + 1, dtype=bias_dtype, device=device)),
                     ask(f"a 1 x {n} bias ({device})", a, b, fresh(1, n, dtype=bias_dtype, device=device)),
                     ask(f"a {other} bias ({device})", a, b, fresh(n, dtype=other, device=device)),
                     ask(f"a strided bias (every second value) ({device})", a, b, strided,
                         right=lambda c: error_ratio(c, a, b, strided) <= 1.0)]
    with FakeTensorMode():  # no GPU needed
        a, b = torch.empty(m, k, dtype=torch.half, device="cuda"), torch.empty(k, n, dtype=torch.half, device="cuda")
        problems += [ask(f"{what} (fake cuda)", a, b, bias) for what, bias in (
            ("a CPU bias", torch.empty(n)), (f"a bias of length {n + 1}", torch.empty(n + 1, device="cuda")),
            ("a torch.float16 bias", torch.empty(n, dtype=torch.half, device="cuda")))]
    if not why_no_kernel(operator):
        children = {what: subprocess.Popen([sys.executable, "-c", CHILD_CALL, operator.python_file,
                                            bias_op._qualified_op_name, *arguments], text=True,
                                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
                    for what, arguments in FAULTING_CALLS.items()}
        for what, child in children.items():
            out, err = child.communicate(timeout=600)
            said, what = (out.strip().splitlines() or [""])[-1], f"{what} (cuda, in a child process)"
            last = (err.strip().splitlines() or ["no error"])[-1][:200]  # a fault ends the child with an error
            problems.append(named(what, said[len("raised "):]) if said.startswith("raised ") else
                            f"{what}: the call returned instead of raising; then: {said or last}")
    calls, problems = len(problems), [problem for problem in problems if problem]
    require(not problems, "\n".join(problems) + "\nA refusal is a TORCH_CHECK (torch._check in the fake) "
                                                "whose message names the bias and what it saw.")
    return f"{calls} calls refused ({'cpu, fake cuda' if why_no_kernel(operator) else 'cpu, fake cuda, cuda'}), " \
           "each naming the bias"


def exercise_cuda_forward(operator, bias_op):
    require_gpu(operator)
    try:
        return ", ".join(forward_on_gpu(bias_op, *shape, bias=True) for shape in ((256, 512, 384), (512, 1024, 128)))
    except NotImplementedError as error:  # the dispatcher found no CUDA kernel
        raise raised(operator, "the forward", error, "No CUDA implementation: binding.cpp's "
                     "TORCH_LIBRARY_IMPL(day87, CUDA, m) needs an m.impl spelt as in the schema.") from None


def exercise_cuda_gradient(operator, bias_op):
    """The gradients of a, b and bias through the CUDA implementation against
    float64 autograd through addmm (the CPU rows differentiate the float64 path);
    then grad_bias where its entries pass FP16's largest value, 65504."""
    require_gpu(operator)
    m, k, n, rows = 256, 384, 512, 8192  # the lesson's first shape
    inputs = [fresh(*shape, dtype=dtype, device="cuda", requires_grad=True)
              for shape, dtype in (((m, k), torch.half), ((k, n), torch.half), ((n,), torch.float32))]
    grad = fresh(m, n, dtype=torch.float32, device="cuda")
    bias = fresh(n, dtype=torch.float32, device="cuda", requires_grad=True)
    large = 10 + 0.1 * fresh(rows, n, dtype=torch.float32, device="cuda")
    tall = [fresh(rows, op.TILE_K, dtype=torch.half, device="cuda"), fresh(op.TILE_K, n, dtype=torch.half, device="cuda")]
    try:
        bias_op(*inputs).backward(grad)
        (got,) = torch.autograd.grad(bias_op(*tall, bias), bias, large)
    except Exception as error:
        raise raised(operator, "the CUDA forward or backward", error) from None
    wide = [t.detach().double().cpu().requires_grad_() for t in inputs]
    torch.addmm(wide[2], wide[0], wide[1]).backward(grad.double().cpu())
    # As in check 7: FP16 inputs and gradients (2^-11 each) and FP32 arithmetic,
    # about 1e-3 in norm. A missing or wrong formula is off by order 1.
    for name, mine, expected in zip(("a", "b", "bias"), inputs, wide):
        require(mine.grad is not None, f"the gradient of {name} is None after backward on CUDA: is a backward "
                                       f"registered in {operator.python_name}'s _register?")
        error = (mine.grad.double().cpu() - expected.grad).norm() / expected.grad.norm()
        require(error <= 1e-2, f"the gradient of {name} on CUDA at {m}x{k}x{n} is off by {error:.2e} in norm "
                               f"(bound 1e-2)" + ("\n" + HINT.format(2)) * (name == "bias"))
    # In FP32 each entry is within 8192 * 2^-24 = 5e-4 of float64, relatively.
    wide_bias = bias.detach().double().cpu().requires_grad_()
    (expected,) = torch.autograd.grad(torch.addmm(wide_bias, *(t.double().cpu() for t in tall)), wide_bias,
                                      large.double().cpu())
    worst = ((got.double().cpu() - expected).abs() / expected).max().item()  # inf or NaN fails below
    require(worst <= rows * 2.0**-24, f"with grad_bias's entries near {expected.mean().item():.0f} (FP16 stops at "
                                      f"65504), grad_bias on CUDA is off by {worst:.1e}: it passed through FP16. "
                                      "Keep it in grad's dtype.")
    return f"grads of a, b, bias match float64; grad_bias right with entries near {expected.mean().item():.0f}"


def check_autograd(operator, device):
    """Gradients for every way a caller asks, only a, only b, both, for parameters
    before and after the op, against float64. Failure modes: with no backward the
    output has no grad_fn, and upstream parameters keep grad None while training
    runs; a backward that saves or unpacks a and b in the wrong order fails one."""
    mm = operator.wrapper
    if device == "cuda":
        require_gpu(operator)
    # On CUDA, FP16 rounding of inputs and gradients (2^-11 each) and FP32 sums:
    # about 1e-3 in norm. A missing or wrong formula is off by order 1.
    (m, k, n, dtype), tolerance = (((128, 32, 256, torch.half), 1e-2) if device == "cuda"
                                   else ((4, 3, 5, torch.float64), 1e-10))
    for wants in ("only a", "only b", "a and b"):
        x = fresh(m, k, dtype=dtype, device=device)
        params = {"upstream": fresh(m, k, dtype=dtype, device=device, requires_grad=wants != "only b"),
                  "weight": fresh(k, n, dtype=dtype, device=device, requires_grad=wants != "only a"),
                  "downstream": fresh(n, dtype=op.accumulate_dtype(dtype), device=device, requires_grad=True)}
        wide = {name: p.detach().double().cpu().requires_grad_(p.requires_grad) for name, p in params.items()}
        c = mm(x * params["upstream"], params["weight"])
        require(c.grad_fn is not None, "the op's output has no grad_fn: the graph ends at the op")
        (torch.tanh(c) * params["downstream"]).sum().backward()
        (torch.tanh((x.double().cpu() * wide["upstream"]) @ wide["weight"]) * wide["downstream"]).sum().backward()
        for name, p in params.items():
            if p.requires_grad:
                require(p.grad is not None, f"{wants} want gradients: '{name}' received none")
                error = (p.grad.double().cpu() - wide[name].grad).norm() / wide[name].grad.norm()
                require(error <= tolerance, f"{wants} want gradients: '{name}' is off by {error:.2e}")
    return "only a, only b, both: every gradient matches float64"


def check_compile(operator, device):
    """fullgraph=True, forward and backward, static and dynamic shapes, equal to
    eager; then each rule the fake sees fails as in eager. Failure modes: with no
    fake Dynamo cannot trace the call (with fullgraph=True that raises, without it
    the graph splits); a fake's bare torch._check says only "Expected cond to be
    True"; a TypeError in a fake prints a wall of log before the error."""
    mm = operator.wrapper
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    if device == "cuda":
        require_gpu(operator)
    # Distinct M, K and N: Dynamo gives equal sizes one symbol ("duck sizing"),
    # and a later call where they differ would recompile.
    dtype, shapes = ((torch.half, [(128, 32, 256), (256, 64, 384)]) if device == "cuda"
                     else (torch.float64, [(4, 3, 5), (6, 7, 2)]))
    report = []
    for dynamic in (False, True):
        torch._dynamo.reset()
        counters.clear()
        # aot_eager traces with fake tensors as inductor would, and runs the same
        # kernels as eager: outputs and gradients must equal eager's.
        counter = CompileCounterWithBackend("aot_eager")
        compiled = torch.compile(lambda a, b, s: torch.relu(mm(a, b)) * s, backend=counter,
                                 fullgraph=True, dynamic=dynamic)
        for m, k, n in shapes if dynamic else shapes[:1]:
            a, b = fresh(m, k, dtype=dtype, device=device), fresh(k, n, dtype=dtype, device=device)
            scale = fresh(n, dtype=op.accumulate_dtype(dtype), device=device)
            eager, graph = [[t.clone().requires_grad_() for t in (a, b)] for _ in range(2)]
            expected, got = torch.relu(mm(*eager)) * scale, compiled(*graph, scale)
            torch.testing.assert_close(got, expected)
            grad = torch.randn_like(got)
            expected.backward(grad)
            got.backward(grad)
            for mine, theirs in zip(graph, eager):
                torch.testing.assert_close(mine.grad, theirs.grad)
        breaks, kind = sum(counters["graph_break"].values()), "dynamic" if dynamic else "static"
        require(counter.frame_count == 1 and breaks == 0, f"{kind}: {counter.frame_count} graphs, {breaks} breaks")
        report.append(f"{kind}: 1 graph, 0 breaks")
    # Contiguity and alignment are not the fake's to check: a fake tensor's strides
    # under compile need not be eager's, and it has no address.
    calls = [call for call in contract_calls(device)
             if call[2] not in ("contiguous", "alignment") and call[0] is not None]
    records, recorder = [], logging.Handler(logging.WARNING)
    recorder.emit = records.append
    logging.getLogger("torch").addHandler(recorder)
    try:
        for a, b, rule in calls:
            eager = expect_raise(mm, a, b, rule).splitlines()[0]
            torch._dynamo.reset()
            compiled = expect_raise(torch.compile(mm, backend="aot_eager", fullgraph=True), a, b, rule)
            require(eager in compiled, f"rule '{rule}': eager says {eager!r}, compiled says {compiled[:300]!r}")
    finally:
        logging.getLogger("torch").removeHandler(recorder)
    require(not records, f"{len(records)} log lines while compiling, e.g. {records[0].getMessage()[:200]!r}"
            if records else "")
    return "; ".join(report) + f"; equal to eager; {len(calls)} rules fail with eager's message, no log"


def check_stream_order(operator):
    """Inputs written on a side stream after slow work, the op called on that
    stream with no synchronization. Failure mode: a kernel launched on any other
    stream (the legacy default one, say) runs during the sleep and reads the stale
    values, so the result matches the old inputs instead of the new ones."""
    mm = operator.wrapper
    require_gpu(operator)
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
    ratio = error_ratio(c, new_a, new_b)
    require(ratio <= 1.0, f"result does not match the inputs written on the stream "
                          f"({100 * ratio:.3g}% of bound): the kernel ran before them")
    return f"{100 * ratio:.1f}% of bound after a 50 ms producer"


def check_profiler(operator):
    """The next lesson reads this profile. Failure mode: a call that is not the
    registered op (a raw kernel wrapper, or plain torch.mm) has no event of the
    operator's name, and a kernel launched outside the op is not attributed to it."""
    mm = operator.wrapper
    require_gpu(operator)
    from torch.profiler import ProfilerActivity, profile

    a, b = fresh(256, 128, dtype=torch.half, device="cuda"), fresh(128, 512, dtype=torch.half, device="cuda")
    mm(a, b)  # warm up outside the profile
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch's notice about profiler cycles
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            mm(a, b)
            torch.cuda.synchronize()
    op_events = [e for e in profiler.events() if e.name == operator.name]
    require(op_events, f"no {operator.name} event in the profile")

    def kernels_under(event):
        return [k.name for k in event.kernels] + [name for child in event.cpu_children for name in kernels_under(child)]

    kernels = [name for e in op_events for name in kernels_under(e)]
    require(any(operator.kernel in name for name in kernels),
            f"no {operator.kernel} attributed to {operator.name} (its kernels: {kernels})")
    return f"{operator.name} -> {operator.kernel}"


def check_no_host_sync(operator):
    """The forward, then the backward, must return while the GPU is still busy.
    Failure modes: a .item(), a print of a CUDA value or a stream synchronize
    through PyTorch raises under sync debug mode 'error'; that mode does not see
    torch.cuda.synchronize() or a cudaDeviceSynchronize() inside an extension, so
    each call is also queued behind GPU sleep on the current stream, and a call
    that waited for the GPU in any way returns only after the sleep has ended."""
    mm = operator.wrapper
    require_gpu(operator)
    a = fresh(128, 64, dtype=torch.half, device="cuda", requires_grad=True)
    b = fresh(64, 256, dtype=torch.half, device="cuda", requires_grad=True)
    grad = fresh(128, 256, dtype=torch.float32, device="cuda")
    mm(a, b).backward(grad)  # first-call costs (cuBLAS's handle, module loading) stay out
    torch.cuda.synchronize()
    stream = torch.cuda.current_stream()
    for phase in ("forward", "backward"):
        c = mm(a, b) if phase == "backward" else None
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        with warnings.catch_warnings():  # "sync debug mode is a prototype feature"
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
            try:
                if phase == "forward":
                    mm(a, b)
                else:
                    c.backward(grad)
            finally:
                torch.cuda.set_sync_debug_mode("default")
        waited = stream.query()  # True: the sleep queued before the call has ended
        torch.cuda.synchronize()
        require(not waited, f"the {phase} returned only after the GPU sleep queued before it had "
                            "ended: it waited for the GPU (a device-wide synchronize, a stream "
                            "synchronize, or a value read back)")
    require(a.grad is not None and b.grad is not None, "backward produced no gradients")
    return "forward and backward returned with the GPU busy, under sync debug mode 'error'"


# About 100 ms of GPU cycles on an H200 (125 ms on a T4): far longer than a call's
# host time, so a call that did not wait always returns while it runs.
SLEEP_CYCLES = 200_000_000


def check_device_guard(operator):
    """Called from a thread whose current device is 0 on inputs on cuda:1. Failure
    mode: without the CUDAGuard, at::empty allocates on the current device, cuda:0,
    and the launch pairs a cuda:1 stream with the wrong device: the output comes
    back on cuda:0 (or the launch fails) and the row reports which."""
    mm = operator.wrapper
    require_gpu(operator, count=2)
    torch.cuda.set_device(0)
    a = fresh(256, 128, dtype=torch.half, device="cuda:1", requires_grad=True)
    b = fresh(128, 512, dtype=torch.half, device="cuda:1", requires_grad=True)
    c = mm(a, b)
    require(c.device == a.device, f"output on {c.device}, inputs on {a.device}")
    require(torch.cuda.current_device() == 0,
            f"current device is {torch.cuda.current_device()} after the call, was 0")
    ratio = error_ratio(c, a, b)
    require(ratio <= 1.0, f"error is {100 * ratio:.3g}% of the bound")
    c.backward(torch.ones_like(c))
    require(a.grad.device == a.device and b.grad.device == b.device,
            f"gradients on {a.grad.device} and {b.grad.device}")
    require(torch.cuda.current_device() == 0, "current device changed by the backward")
    expect_raise(mm, fresh(256, 128, dtype=torch.half, device="cuda:0"), b.detach(), "one device")
    return f"output and gradients on cuda:1, {100 * ratio:.1f}% of bound, current device still 0"


def check_backward_accuracy(operator):
    """grad_a and grad_b from FP32 gradients of several kinds against float64, within
    error_ratio's bound for an FP16-rounded product. Tiny gradients give subnormal
    FP16 results (the bound's 2^-25). And a grad with padded rows, as
    torch.cat([c1, c2], dim=1) hands c1 (row stride N + 8): a backward that reads
    grad's memory as one dense run takes the padding for values."""
    mm = operator.wrapper
    require_gpu(operator)
    m, k, n = 256, 384, 512
    report = []
    for regime in ("1e-7..1e-5", "randn", "padded rows"):
        a = fresh(m, k, dtype=torch.half, device="cuda", requires_grad=True)
        b = fresh(k, n, dtype=torch.half, device="cuda", requires_grad=True)
        grad = torch.randn(m, n + 8 * (regime == "padded rows"), device="cuda")[:, :n]
        if regime == "1e-7..1e-5":
            grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
        mm(a, b).backward(grad)
        worst = max(error_ratio(a.grad, grad, b.t(), more_bound=operator.gradient_bound),
                    error_ratio(b.grad.t(), grad.t(), a, more_bound=operator.gradient_bound))
        require(worst <= 1.0, f"{regime}: {100 * worst:.3g}% of the bound")
        report.append(f"{regime}: {100 * worst:.1f}%" + (" of bound" if not report else ""))
    return "; ".join(report)


def check_gate_compiles(operator):
    """gate.cu is the launcher's third caller, beside binding.cpp's declaration and
    call: a launcher whose parameters change (the exercise's bias) must change there
    too. Compiled, not linked (pip's toolkit has no static runtime to link), for one
    architecture at -O0, where nvcc exists, and cached by the contents of gate.cu and
    kernel.cu; the gate runs on a GPU from checks/."""
    home = operator.build["cuda_home"]
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc:
        raise Skip("no nvcc")
    sources = [os.path.join(operator.folder, name) for name in ("gate.cu", "kernel.cu")]
    key = hashlib.sha256(b"\0".join(pathlib.Path(path).read_bytes() for path in sources)).hexdigest()[:16]
    gate = os.path.join(os.path.dirname(operator.build["directory"]), f"{operator.namespace}-gate-{key}", "gate.o")
    headers = [f"-I{folder}" for folder in (operator.build["toolkit"] or {}).get("include", [])]  # pip's toolkit
    if not os.path.exists(gate):
        os.makedirs(os.path.dirname(gate), exist_ok=True)
        built = subprocess.run([nvcc, "-c", "-O0", "-arch=sm_75", *headers, "-o", gate, sources[0]],
                               capture_output=True, text=True)
        require(built.returncode == 0, f"gate.cu does not compile: {op.first_compiler_error(built.stderr)}\n"
                                       "gate.cu includes kernel.cu and calls launchWmmaGemm: its calls follow "
                                       "the definition.")
    return "gate.cu compiles, for sm_75 at -O0"


# ---------------------------------------------------------------------------
# The table, top to bottom
# ---------------------------------------------------------------------------
def lesson_rows(operator=LESSON):
    """The table's rows, 1 to 14, each checking `operator`, then its more_rows."""
    def row(name, compares, check, *arguments):
        return name, compares, lambda: check(operator, *arguments)

    return [
        row("1 contract, cpu", "calls that must raise, naming their rule", check_contract, "cpu"),
        row("1 contract, cuda", "calls that must raise, naming their rule", check_contract, "cuda"),
        row("2 forward 256x512x384", "kernel vs float64 CPU reference", check_forward, 256, 512, 384),
        row("2 forward 512x1024x128", "kernel vs float64 CPU reference", check_forward, 512, 1024, 128),
        row("3 opcheck, cpu f64", "schema, fake impl, autograd registration", check_opcheck, "cpu"),
        row("3 opcheck, cuda f16", "schema, fake impl, autograd registration", check_opcheck, "cuda"),
        row("4 gradcheck", "registered formula vs numerical Jacobian", check_gradcheck),
        row("5 gradcheck rejects", "a grad_a scaled by 1.01 must raise", check_gradcheck_rejects),
        *exercise_rows(operator),
        row("7 autograd, cpu f64", "only a, only b, both: grads vs float64", check_autograd, "cpu"),
        row("7 autograd, cuda f16", "only a, only b, both: grads vs float64", check_autograd, "cuda"),
        row("8 torch.compile, cpu f64", "fwd+bwd vs eager; errors as eager's", check_compile, "cpu"),
        row("8 torch.compile, cuda f16", "fwd+bwd vs eager; errors as eager's", check_compile, "cuda"),
        row("9 stream order", "inputs written late on a side stream", check_stream_order),
        row("10 profiler", f"{operator.name} with its kernel under it", check_profiler),
        row("11 no host sync", "fwd+bwd return with the GPU still busy", check_no_host_sync),
        row("12 device guard", "call on cuda:1 from current device 0", check_device_guard),
        row("13 backward accuracy", "grads: tiny, randn, padded rows vs float64", check_backward_accuracy),
        row("14 gate.cu compiles", "the launcher's third caller, nvcc alone", check_gate_compiles),
        *((name, compares, lambda check=check: check(operator)) for name, compares, check in operator.more_rows),
    ]


def print_provenance(operator=LESSON):
    built, cuda_home = operator.build, operator.build["cuda_home"]
    nvcc = "not found"
    if cuda_home:
        nvcc = subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                              capture_output=True, text=True).stdout.strip().replace("\n", "\n    ")
    devices = [f"device {i}: {torch.cuda.get_device_name(i)}, capability {torch.cuda.get_device_capability(i)}"
               for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else ["device: no GPU visible"]
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
          f"python {platform.python_version()}, torch {torch.__version__}, built for CUDA {torch.version.cuda}",
          f"torch.cuda.get_arch_list(): {torch.cuda.get_arch_list()}", f"nvcc --version:\n    {nvcc}", *devices,
          f"operator: {operator.name}, from {operator.folder}",
          f"extension: {'CUDA + CPU' if built['with_cuda'] else 'CPU only'}, architectures {built['archs']}, "
          f"in {built['directory']}\n", sep="\n")


def main(operator=LESSON):
    # A crash in native code prints the Python stack that led to it, not just
    # "Segmentation fault": the harness exists to find such crashes.
    faulthandler.enable()
    print_provenance(operator)
    reason = why_no_kernel(operator)
    ok = run_table(lesson_rows(operator), notes=[f"the CUDA kernel was not run: {reason}"] if reason else [])
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
