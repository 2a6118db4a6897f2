"""test_op.py: the day 87 harness: provenance, then the lesson's table.

    python test_op.py

A row per check: pass, FAIL or skip, and why; the exit status is 1 if any failed.
Checks 1 to 6 are the lesson's, 7 to 13 prove the rest of what it promises, 14
builds gate.cu and, where a GPU is visible, runs it.
"""

import argparse
import collections
import contextlib
import copy
import datetime
import faulthandler
import hashlib
import importlib
import logging
import math
import multiprocessing
import os
import pathlib
import platform
import re
import shutil
import signal
import subprocess
import sys
import traceback
import warnings

if __name__ == "__main__":
    # --help answers before torch loads.
    argparse.ArgumentParser(description=__doc__,
                            formatter_class=argparse.RawDescriptionHelpFormatter).parse_args()

import torch  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode, UnsupportedOperatorException  # noqa: E402
from torch.autograd.gradcheck import GradcheckError  # noqa: E402

import op  # noqa: E402


# --- The operator under test ---
class Operator:
    """What the table checks, and where a failure's fix goes. Each attribute defaults to
    the lesson's; another operator (an installed package, say) sets its own.

    build, the build facts the rows read (default: module.BUILD, op.py's), a dict of
        with_cuda: whether the library holds the CUDA implementation;
        archs: the architectures it was built for, "7.5;8.0+PTX" (None without CUDA);
        library: the library loaded, which the provenance names;
        directory: its build folder, beside which row 14 caches the gate;
        toolkit: the CUDA toolkit, {"home", "include", "cudart"} as op.find_toolkit
            returns it, or None; row 14 builds and links the gate with it;
        cuda_home: that toolkit's folder (its bin/nvcc builds the gate), or None.
    The hints are str.format templates, told to a student whose row failed: each names
    the files where the fix goes, so another operator's names its own."""
    kernel = "wmmaGemmKernel"  # row 10 looks for it under the forward
    gate = None  # row 14's gate.cu; None: the one beside python_file
    # Row 14's advice where the gate fails: the launcher gate.cu calls, and where it is defined.
    launcher, launcher_file = "launchWmmaGemm", "kernel.cu"
    gate_hint = ("Doing the exercise? gate.cu calls {launcher} itself: its arguments follow "
                 "{launcher_file}'s definition, one for one and in the same order.")
    gate_compile_hint = ("gate.cu includes {launcher_file} and calls {launcher}: its calls "
                         "follow the definition.")
    # Check 6's: {number} is a hint of the exercise; {file} is python_name, {name} the
    # operator's qualified name; {device} the dispatch key, "CPU" or "CUDA".
    exercise_hint = "Hint {number} in README.md's exercise applies."
    no_impl_hint = ("No {device} implementation: binding.cpp's TORCH_LIBRARY_IMPL(day87, "
                    "{device}, m) needs an m.impl spelt as in the schema.")
    no_fake_hint = ("no fake implementation is registered for {name}: torch.compile splits "
                    "the graph there (the lesson's pitfall 'torch.compile gets slower'); "
                    "{file}'s _register needs register_fake")
    fake_order_hint = ("{file}'s fake checks binding.cpp's rules in binding.cpp's order: a and "
                       "b's (check_matrices) before anything that needs a's dtype "
                       "(accumulate_dtype has none for float32)")
    no_backward_hint = ("no backward is registered for {name}: on the CPU autograd records "
                        "the float64 kernel's own ATen ops and only warns; on CUDA the "
                        "gradients stay None (the lesson's pitfall 'training runs, but the loss "
                        "does not move'); {file}'s _register needs register_autograd")
    none_gradient_hint = "is a backward registered in {file}'s _register?"

    def __init__(self, namespace, module, build=None):
        self.namespace, self.module = namespace, module
        self.name = f"{namespace}::wmma_mm"
        self.wrapper = module.wmma_mm  # what users call: a, b -> c
        self.bias_wrapper = getattr(module, "wmma_mm_bias", None)  # check 6's, once written
        self.build = module.BUILD if build is None else build
        self.python_file = module.__file__  # where its fake and backward are registered

    @property
    def overload(self):
        return getattr(torch.ops, self.namespace).wmma_mm.default

    @property
    def bias_op(self):
        return getattr(getattr(torch.ops, self.namespace), "wmma_mm_bias", None)

    @property
    def python_name(self):  # "op.py": where a student looks for _register
        return os.path.basename(self.python_file)

    @property
    def folder(self):
        return os.path.dirname(os.path.abspath(self.python_file))

    @property
    def gate_source(self):
        return self.gate or os.path.join(self.folder, "gate.cu")

    def with_wrapper(self, wrapper):
        other = copy.copy(self)
        other.wrapper = wrapper
        return other

    def gate_target(self, architecture):
        """nvcc's flags that build row 14's gate for `architecture` ("sm_75")."""
        return [f"-arch={architecture}"]

    def with_gate(self, source):  # row 14 on another gate.cu (checks/self_test.py's wrong one)
        other = copy.copy(self)
        other.gate = source
        return other


LESSON = Operator("day87", op)


# --- The table: a check returns a detail, or raises Skip or Fail ---
class Skip(Exception):
    """The row cannot run here."""


class Fail(Exception):
    """The row ran and found a defect."""


def require(condition, message):
    if not condition:
        raise Fail(message)


def run_table(rows, notes=()):
    """Rows are (name, what it compares, check); True when nothing failed."""
    print(f"{'check':<42}{'what it compares':<52}result")
    counts = {"pass": 0, "FAIL": 0, "skip": 0}
    for name, compares, check in rows:
        try:
            status, detail = "pass", str(check())
        except Skip as reason:
            status, detail = "skip", str(reason)
        except Fail as defect:
            status, detail = "FAIL", str(defect)
        except Exception as error:  # a crash in a check is a failure, with its cause
            status, detail = "FAIL", f"{type(error).__name__}: {error}"
        if status == "FAIL" and not BROKEN_CONTEXT and context_broken():
            BROKEN_CONTEXT.append(name)
            detail = f"{first_line(detail)}\n{BROKEN_CONTEXT_HINT}"
        counts[status] += 1
        print(f"{name:<42}{compares:<52}{status}, " + "\n    ".join(detail.splitlines()),
              flush=True)
    for note in notes:
        print(note)
    print(f"{counts['pass']} passed, {counts['FAIL']} failed, {counts['skip']} skipped")
    return counts["FAIL"] == 0


def why_no_kernel(operator=LESSON):
    """Why the CUDA kernel cannot run here, or None."""
    if not torch.cuda.is_available():
        return "no GPU visible"
    if not operator.build["with_cuda"]:
        return "the extension was built without its CUDA part"
    return None


# A faulting kernel breaks the process's CUDA context: every later call fails.
BROKEN_CONTEXT = []  # the row whose kernel faulted


def context_broken():  # this process's: a child process's fault is its own
    if not torch.cuda.is_available():
        return False
    try:
        torch.cuda.synchronize()
    except RuntimeError:
        return True
    return False
BROKEN_CONTEXT_HINT = (
    "A kernel read or wrote outside its buffers, and the CUDA context of this process is "
    "now broken: the later CUDA rows cannot run. Doing the exercise? wmma_mm passes no "
    "bias (a null pointer): the kernel may read the bias only where one is given.")


def require_gpu(operator, count=1):
    if why_no_kernel(operator):
        raise Skip(why_no_kernel(operator))
    if BROKEN_CONTEXT:
        raise Fail(f"not run: a kernel in row '{BROKEN_CONTEXT[0]}' faulted and broke the "
                   "CUDA context; fix that first")
    if torch.cuda.device_count() < count:
        raise Skip(f"needs {count} GPUs")


# --- References and the error bound ---
def fresh(*shape, dtype, device="cpu", requires_grad=False):
    """Fresh standard-normal values, never zeros."""
    return torch.randn(*shape, dtype=torch.float64).to(device, dtype).requires_grad_(requires_grad)


def double(*shape, requires_grad=False):
    return fresh(*shape, dtype=torch.float64, requires_grad=requires_grad)


def half(*shape, device="cuda", requires_grad=False):
    return fresh(*shape, dtype=torch.half, device=device, requires_grad=requires_grad)


def single(*shape, requires_grad=False):
    return fresh(*shape, dtype=torch.float32, device="cuda", requires_grad=requires_grad)


def to64(t):
    return t.detach().double().cpu()


def reference_and_bound(result, a, b, extra=None):
    """a @ b (+ extra) in float64 from the same values, and each element's error bound,
    derived here once. FP16 products are
    exact in FP32 (11 + 11 bits fit in 24), so the error is the K - 1 FP32 additions':
    at most (K - 1) * 2^-24 * sum_p |a_ip b_pj| rounding to nearest, 2^-23 each where
    tensor cores truncate (float64: 2^-51):
        bound_ij = K * 2^-23 * (|A| @ |B|)_ij
    An FP16 result (a gradient) is rounded once more: 2^-11 relative, 2^-25 subnormal."""
    a64, b64 = to64(a), to64(b)
    reference, magnitude = a64 @ b64, a64.abs() @ b64.abs()
    if extra is not None:
        extra64 = to64(extra)
        reference, magnitude = reference + extra64, magnitude + extra64.abs()
    unit = 2.0**-51 if a.dtype == torch.float64 else 2.0**-23
    additions = a.shape[1] + (extra is not None)
    bound = additions * unit * magnitude + torch.finfo(torch.float64).tiny
    if result.dtype == torch.half:
        bound += 2.0**-11 * reference.abs() + 2.0**-25
    return reference, bound


def worst_ratio(result, reference, bound):
    """The worst |result - reference| / bound: 1.0 is the edge; inf where not finite."""
    result64 = to64(result)
    if result64.shape != reference.shape:
        raise Fail(f"shape {tuple(result64.shape)}, expected {tuple(reference.shape)}")
    if not torch.isfinite(result64).all():
        return math.inf
    return ((result64 - reference).abs() / bound).max().item() if result64.numel() else 0.0


def error_ratio(result, a, b, extra=None):
    """How much of the bound result uses against a @ b (+ extra): 1.0 is the edge."""
    return worst_ratio(result, *reference_and_bound(result, a, b, extra))


def jacobian_mismatches(fn, inputs, names, epsilon=1e-6):
    """As gradcheck, but a line per input that disagrees, with its first wrong entries."""
    analytical = torch.autograd.functional.jacobian(lambda *x: fn(*x).reshape(-1), tuple(inputs))
    problems = []
    columns = fn(*inputs).shape[1]
    for which, (x, name) in enumerate(zip(inputs, names)):
        def at(step):
            return fn(*inputs[:which], x + step, *inputs[which + 1:]).reshape(-1)

        steps = epsilon * torch.eye(x.numel(), dtype=x.dtype).view(-1, *x.shape)
        numerical = torch.stack([(at(step) - at(-step)) / (2 * epsilon) for step in steps], dim=1)
        backward = analytical[which].reshape(numerical.shape)
        wrong = ((backward - numerical).abs() > 1e-5 + 1e-3 * numerical.abs()).nonzero().tolist()
        entries = [f"d out[{o // columns}][{o % columns}]/d {name}"
                   f"{list(divmod(e, x.shape[1])) if x.dim() == 2 else [e]}: analytical "
                   f"{backward[o, e]:.4g}, numerical {numerical[o, e]:.4g}" for o, e in wrong[:3]]
        if wrong:
            problems.append(f"{name}: {len(wrong)} of {backward.numel()} Jacobian entries "
                            "wrong, e.g. " + "; ".join(entries))
    return problems


# --- The checks, in order; checks/self_test.py hands each a wrong Operator ---
def expect_raise(mm, a, b, rule):
    """The call must raise an error that names `rule`; returns the message."""
    try:
        mm(a, b)
    except (RuntimeError, ValueError, TypeError) as error:
        require(f"'{rule}'" in str(error),
                f"rule '{rule}': raised, but the message does not name it: {error}")
        return str(error)
    raise Fail(f"rule '{rule}': the call returned instead of raising "
               f"(a: {describe(a)}; b: {describe(b)})")


def describe(t):
    if torch.is_tensor(t):
        return f"{tuple(t.shape)} {t.dtype} {t.device}, strides {t.stride()}"
    return repr(t)


def contract_calls(device):
    """(a, b, the rule) for calls that break one rule each."""
    if device == "cpu":
        return [(fresh(4, 3, dtype=torch.float32), fresh(3, 5, dtype=torch.float32), "dtype"),
                (double(4, 3), double(3), "two matrices"),
                (None, double(3, 5), "two matrices"),
                (double(4, 3), double(7, 5), "inner dimensions"),
                (double(4, 3), double(5, 3).t(), "contiguous")]

    flat = half(128 * 16 + 1)
    return [(single(128, 16), single(16, 128), "dtype"),
            (half(128, 16), half(16, 128, device="cpu"), "one device"),
            (half(128, 16), half(128, 16).t(), "contiguous"),
            (half(100, 16), half(16, 128), "tile"),
            (flat[1:].view(128, 16), half(16, 128), "alignment")]


def check_contract(operator, device):
    """Failure modes: an unchecked rule returns garbage (a transposed view read
    row-major) or faults (a misaligned 16-byte copy)."""
    if device == "cuda":
        require_gpu(operator)
    calls = contract_calls(device)
    for a, b, rule in calls:
        expect_raise(operator.wrapper, a, b, rule)
    said = f"{len(calls)} calls raised, each naming its rule"
    if device == "cpu":
        return said
    forward_on_gpu(operator.wrapper, op.TILE_M, op.TILE_N, op.TILE_K)
    return said + "; a valid call still works"


def check_forward(operator, m, n, k):
    require_gpu(operator)
    return forward_on_gpu(operator.wrapper, m, n, k)


def forward_on_gpu(mm, m, n, k, bias=False):
    """The % of the bound mm uses on fresh FP16 inputs; call require_gpu first."""
    a, b = half(m, k), half(k, n)
    extra = single(n) if bias else None
    # Freed NaNs for the output: an element never written stays NaN.
    torch.full((m, n), math.nan, dtype=torch.float32, device="cuda")
    c = mm(a, b, extra) if bias else mm(a, b)
    torch.cuda.synchronize()
    require(c.dtype == torch.float32 and c.device == a.device,
            f"output is {c.dtype} on {c.device}, expected torch.float32 on {a.device}")
    problem = forward_problem(c, a, b, extra, f"{m}x{n}x{k}")
    require(problem is None, problem)
    return f"{100 * error_ratio(c, a, b, extra):.1f}% of bound"


def forward_problem(c, a, b, bias, shape):
    """None where c is within the bound; else the error, its worst entry and, with a
    bias, what c equals."""
    expected, bound = reference_and_bound(c, a, b, bias)
    ratio = worst_ratio(c, expected, bound)
    if ratio <= 1.0:
        return None
    relative = (to64(c) - expected).abs() / (expected.abs() + 1)
    i, j = divmod(relative.argmax().item(), c.shape[1])
    equals = "" if bias is None else f"the output is {what_the_output_equals(c, a, b, bias)}; "
    return (f"{shape}: {equals}error is {100 * ratio:.3g}% of the bound; "
            f"out[{i}][{j}] = {c[i, j].item():.6g}, expected {expected[i, j]:.6g}")


def check_opcheck(operator, device):
    if device == "cuda":
        require_gpu(operator)
        a, b = half(128, 32), half(32, 256)
    else:
        a, b = double(4, 3), double(3, 5)
    a.requires_grad_()
    b.requires_grad_()
    results = torch.library.opcheck(operator.overload, (a, b), raise_exception=False)
    failed = {test: outcome for test, outcome in results.items() if outcome != "SUCCESS"}
    require(not failed, f"opcheck failed: {failed}")
    return ", ".join(sorted(results))


def check_gradcheck(operator):
    a, b = double(4, 3, requires_grad=True), double(3, 5, requires_grad=True)
    try:
        torch.autograd.gradcheck(operator.wrapper, (a, b))
    except GradcheckError as error:
        raise Fail("\n".join([f"gradcheck: {first_line(error)}"]
                             + jacobian_mismatches(operator.wrapper, (a, b), ["a", "b"]))) from None
    return "analytical and numerical Jacobians agree"


def check_gradcheck_rejects(operator):
    class WrongGradA(torch.autograd.Function):
        @staticmethod
        def forward(ctx, a, b):
            ctx.save_for_backward(a, b)
            return operator.overload(a, b)

        @staticmethod
        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            return 1.01 * (grad @ b.t()), a.t() @ grad

    try:
        check_gradcheck(operator.with_wrapper(WrongGradA.apply))
    except Fail:
        return "GradcheckError raised for grad_a scaled by 1.01"
    raise Fail("gradcheck accepted a grad_a scaled by 1.01: it would accept anything")


# --- Check 6: the exercise, wmma_mm_bias ---
def exercise_rows(operator=LESSON):
    """Check 6 grades operator.bias_op; a failing row says what it saw, where, and which
    hint applies, never the gradient's formula."""
    bias_op = operator.bias_op
    if bias_op is None:
        return [("6 exercise: wmma_mm_bias", f"torch.ops.{operator.namespace}.wmma_mm_bias",
                 no_exercise_yet)]
    questions = (
        ("forward", "a @ b + bias, cpu f64, M != N and M == N", exercise_forward),
        ("gradient", "registered; Jacobians; grad_bias vs float64", exercise_gradient),
        ("fake", "shape, dtype: fake cuda f16, cpu f64", exercise_fake),
        ("wrapper", "op.wmma_mm_bias; schema (a, b, bias)", exercise_wrapper),
        ("contract", "bad bias, f32 a or b refused alike: cpu, cuda, fake", exercise_contract),
        ("cuda forward", "both lesson shapes, f16 in, f32 out vs float64", exercise_cuda_forward),
        ("cuda gradient", "grads of a, b, bias through the kernel vs f64", exercise_cuda_gradient))
    return [(f"6 exercise: {question}", compares, lambda check=check: check(operator, bias_op))
            for question, compares, check in questions]


def no_exercise_yet():
    raise Skip("no such operator registered yet")


def no_fake(operator, bias_op):
    return Fail(operator.no_fake_hint.format(name=bias_op._qualified_op_name,
                                             file=operator.python_name))


def first_line(error):
    return (str(error).splitlines() or [""])[0]


def raised(operator, what, error, hint=""):
    """A Fail naming the exception and its innermost line in the operator's folder."""
    where = ""
    for frame in traceback.extract_tb(error.__traceback__):
        path = os.path.abspath(frame.filename)
        if os.path.dirname(path) == operator.folder and path != os.path.abspath(__file__):
            where = f" at {os.path.basename(path)}:{frame.lineno}, in {frame.name}"
    return Fail(f"{what} raised {type(error).__name__}{where}: {first_line(error)[:300]}"
                + (f"\n{hint}" if hint else ""))


def what_the_output_equals(c, a, b, bias):
    """What a wrong c equals, where that is a likely kernel mistake."""
    def within(extra):
        return error_ratio(c, a, b, extra) <= 1.0

    bias64 = to64(bias)
    offset = to64(c) - reference_and_bound(c, a, b)[0]
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
    read = [(bias64 - value).abs().argmin().item() for value in offset[0]]
    if within(offset[0]) and within(bias64[read]):
        return "a @ b + a bias read from other columns: " + ", ".join(
            f"column {j} got bias[{i}]" for j, i in enumerate(read) if i != j)[:160]
    return "not a @ b + bias"


def forward_hint(operator, error, device):
    """No implementation for the device, or Hint 1 where the bias did not broadcast."""
    if isinstance(error, NotImplementedError):
        return operator.no_impl_hint.format(device=device)
    broadcast = re.search(r"size of (the )?tensor|expanded size|shape|broadcast", str(error))
    return broadcast and operator.exercise_hint.format(number=1)


def exercise_forward(operator, bias_op):
    for m, k, n in [(3, 4, 5), (5, 4, 5)]:  # a bias on the wrong axis fails one or the other
        a, b, bias = double(m, k), double(k, n), double(n)
        shape = f"{m}x{k}x{n}"
        try:
            c = bias_op(a, b, bias)
        except Exception as error:
            hint = forward_hint(operator, error, "CPU")
            raise raised(operator, f"{shape}: the forward", error, hint) from None
        problem = forward_problem(c, a, b, bias, shape)
        if problem and "the output's row" in problem:
            problem = f"{problem}\n{operator.exercise_hint.format(number=1)}"
        require(problem is None, problem)
    return "a @ b + bias at 3x4x5 and 5x4x5"


def bias_gradient_problem(operator, bias_op):
    """None where grad_bias as the backward returns it (autograd would sum it to shape)
    matches float64 for a random grad (one-hot ones round exactly in FP16)."""
    hint = operator.exercise_hint.format
    a, b, grad, bias = (double(*shape) for shape in ((6, 3), (3, 4), (6, 4), (4,)))
    m, n = grad.shape
    bias.requires_grad_()
    try:
        out = bias_op(a, b, bias)
    except Exception:  # the forward row says why
        return None
    got = out.grad_fn.apply(grad)[2]
    if got is None:
        return f"grad_bias is None: the backward returns no gradient for the bias. {hint(number=2)}"
    if tuple(got.shape) != (n,):
        return (f"grad_bias has shape {list(got.shape)} for a bias of shape [{n}], from a "
                f"{m}x{n} grad. " + hint(number=1))
    wide = bias.detach().clone().requires_grad_()
    expected, scale = (torch.autograd.grad(torch.addmm(wide, a, b), wide, g)[0]
                       for g in (grad, grad.abs()))
    error = ((got.double() - expected).abs() / scale).max().item()
    if error <= 2.0**-20:  # float32's rounding (2^-24) passes; FP16's (2^-11) does not
        return None
    if error <= 2.0**-10:
        return (f"grad_bias agrees with float64 only to {error:.1e} of its scale, FP16's "
                "precision (2^-11 = 4.9e-04): it passed through FP16 (autograd casts it back "
                "to the bias's dtype), where a value past 65504 is inf. Keep it in grad's dtype.")
    entries = "; ".join(f"grad_bias[{j}]: got {got[j].item():.6g}, expected "
                        f"{expected[j].item():.6g}" for j in range(n))
    return f"from a {m}x{n} grad, {entries}. {hint(number=2)}"


def exercise_gradient(operator, bias_op):
    inputs = [t.requires_grad_() for t in forward_or_skip(bias_op)[:3]]
    registration = torch.library.opcheck(
        bias_op.default, tuple(inputs), raise_exception=False,
        test_utils=("test_autograd_registration",))["test_autograd_registration"]
    require(registration == "SUCCESS", operator.no_backward_hint.format(
        name=bias_op._qualified_op_name, file=operator.python_name))
    # Square: a gradient of the wrong shape shows as wrong entries.
    square = (double(4, 3), double(3, 4), double(4))
    try:
        problems = [problem for problem in [bias_gradient_problem(operator, bias_op)] if problem]
        problems += jacobian_mismatches(bias_op, square, ["a", "b", "bias"])
    except Exception as error:
        unpacked = re.search(r"unpack|cannot be multiplied|NoneType", str(error))
        raise raised(operator, "the backward (or its setup_context)", error, unpacked and (
            "The tensors setup_context saves must be the ones the backward unpacks, as many, "
            "in the same order.")) from None
    require(not problems, "\n".join(problems))
    return "registered; Jacobians of a, b, bias agree; grad_bias to float64's precision"


def exercise_fake(operator, bias_op):
    # On CUDA a fake that returns the input's dtype is wrong; fakes need no GPU.
    m, k, n = 2 * op.TILE_M, 3 * op.TILE_K, 3 * op.TILE_N
    seen = f"fake CUDA tensors ({m}x{k} @ {k}x{n} torch.float16, bias {n} torch.float32)"
    inputs = [Tensor(shape, dtype, "cuda") for shape, dtype in
              (((m, k), torch.half), ((k, n), torch.half), ((n,), torch.float32))]
    try:
        with FakeTensorMode():
            out = bias_op(*map(made, inputs))
    except UnsupportedOperatorException:
        raise no_fake(operator, bias_op) from None
    except Exception as error:
        raise raised(operator, f"the fake, on {seen},", error) from None
    require(tuple(out.shape) == (m, n) and out.dtype == torch.float32,
            f"on {seen} the fake gives {'x'.join(map(str, out.shape))} {out.dtype}; the kernel "
            f"writes {m}x{n} torch.float32 (accumulate_dtype)")
    results = torch.library.opcheck(bias_op.default, forward_or_skip(bias_op)[:3],
                                    test_utils=("test_schema", "test_faketensor"),
                                    raise_exception=False)
    failed = [f"{test}: {first_line(result)[:200]}"
              for test, result in results.items() if result != "SUCCESS"]
    require(not failed, "cpu f64: " + "; ".join(failed))
    return "fake cuda f16 in, f32 out; opcheck test_schema, test_faketensor"


def forward_or_skip(bias_op):
    """a, b, bias at 3x4x5 and the output; Skip where the forward raises."""
    a, b, bias = double(3, 4), double(4, 5), double(5)
    try:
        return a, b, bias, bias_op(a, b, bias)
    except Exception as error:
        raise Skip(f"the forward raises at 3x4x5 ({type(error).__name__}): the forward row "
                   "says where") from None


def exercise_wrapper(operator, bias_op):
    arguments = [argument.name for argument in bias_op.default._schema.arguments]
    require(arguments == ["a", "b", "bias"],
            f"the schema's arguments are ({', '.join(arguments)}), expected (a, b, bias): a call "
            "by keyword reaches the wrong ones")
    wrapper = operator.bias_wrapper
    require(wrapper is not None, f"{operator.python_name} has no wmma_mm_bias(a, b, bias) beside "
            "wmma_mm: the tools and day 88 call it")
    a, b, bias, expected = forward_or_skip(bias_op)
    try:
        wrapped = wrapper(a, b, bias)
    except Exception as error:
        raise raised(operator, "the wrapper at 3x4x5", error) from None
    require(torch.is_tensor(wrapped) and torch.equal(wrapped, expected),
            f"{operator.python_name}'s wmma_mm_bias(a, b, bias) gives {describe(wrapped)}, "
            f"which is not {bias_op._qualified_op_name}(a, b, bias)")
    return f"{operator.python_name}'s wmma_mm_bias agrees; schema (a, b, bias)"


Tensor = collections.namedtuple("Tensor", "shape dtype device")  # one to make, real or fake


def bad_bias_calls():
    """(what, a, b, bias) for each bias the README refuses, each a Tensor to make."""
    m, k, n = 256, 2 * op.TILE_K, op.TILE_N
    calls = []
    for device, dtype, others in (("cpu", torch.float64, [torch.float32]),
                                  ("cuda", torch.half, [torch.float64, torch.half])):
        a, b = Tensor((m, k), dtype, device), Tensor((k, n), dtype, device)
        right = op.accumulate_dtype(dtype)
        calls += [(f"a bias of length N + 1 = {n + 1} ({device})", a, b,
                   Tensor((n + 1,), right, device)),
                  (f"a 1 x {n} bias ({device})", a, b, Tensor((1, n), right, device))]
        calls += [(f"a {other} bias ({device})", a, b, Tensor((n,), other, device))
                  for other in others]
    for what, device, dtype, bias_device in (
            ("a CPU bias beside CUDA a and b", "cuda", torch.half, "cpu"),
            ("a CUDA bias beside CPU a and b in float64", "cpu", torch.float64, "cuda"),
            ("a CUDA bias beside CPU a and b in float16", "cpu", torch.half, "cuda")):
        a, b = Tensor((m, k), dtype, device), Tensor((k, n), dtype, device)
        calls.append((what, a, b, Tensor((n,), torch.float32, bias_device)))
    return calls


def bad_input_calls():
    """(what, a, b, bias) for an a or b in float32 beside a right bias, each a Tensor to
    make: wmma_mm's rule 'dtype', which the fake must ask before accumulate_dtype, whose
    TypeError would stand where eager names the rule."""
    m, k, n = 256, 2 * op.TILE_K, op.TILE_N
    calls = []
    for device, dtype in (("cpu", torch.float64), ("cuda", torch.half)):
        a, b = Tensor((m, k), dtype, device), Tensor((k, n), dtype, device)
        bias = Tensor((n,), op.accumulate_dtype(dtype), device)
        calls += [(f"a in float32 ({device})", a._replace(dtype=torch.float32), b, bias),
                  (f"b in float32 ({device})", a, b._replace(dtype=torch.float32), bias)]
    return calls


def verdict(bias_op, a, b, bias):
    """("raised", its first line) or ("returned", what came back)."""
    try:
        c = bias_op(a, b, bias)
    except UnsupportedOperatorException:
        raise
    except Exception as error:
        return "raised", first_line(error)
    return "returned", f"{list(c.shape)} {c.dtype}"


def made(tensor):  # empty, then filled: a CPU-only torch can make a fake CUDA one so
    return torch.empty(tensor.shape, dtype=tensor.dtype, device=tensor.device).normal_()


def call_in_child(pipe, module_name, namespace, a, b, bias):
    """Where the contract misses a bias on another device, the kernel faults: in a
    process of its own, not the table's."""
    importlib.import_module(module_name)  # registers the operator
    said = verdict(getattr(torch.ops, namespace).wmma_mm_bias, made(a), made(b), made(bias))
    try:
        torch.cuda.synchronize()  # a fault surfaces here
    except RuntimeError as error:
        said = said[0], f"{said[1]}; then: {first_line(error)[:200]}"
    pipe.send(said)


def in_child_processes(argument_lists):
    """call_in_child for each list, each in a spawned process (no CUDA state is copied):
    one that dies or hangs takes no other with it."""
    spawn = multiprocessing.get_context("spawn")
    children = []
    for arguments in argument_lists:
        receiving, sending = spawn.Pipe(duplex=False)
        child = spawn.Process(target=call_in_child, args=(sending, *arguments))
        child.start()
        sending.close()  # the pipe now ends when the child does
        children.append((child, receiving))
    outcomes = []
    for child, receiving in children:
        try:
            if receiving.poll(600):  # seconds
                outcomes.append(receiving.recv())
            else:
                outcomes.append(("returned", "nothing: its process hung for 600 s"))
        except EOFError:
            child.join()
            outcomes.append(("returned", f"nothing: its process died, exit code {child.exitcode}"))
        child.terminate()
        child.join()
    return outcomes


def exercise_contract(operator, bias_op):
    """Each bad bias refused, naming the bias, by the implementation and the fake alike;
    a strided bias may be read right instead (a fake has no strides to check). An a or
    b in float32 is refused naming rule 'dtype', the fake in the implementation's words."""
    def named(what, said, rule=None):  # rule: a and b's; the operator's name has "bias" too
        if rule:
            return None if f"'{rule}'" in said else (
                f"{what}: raised, but not naming rule '{rule}': {said[:200]}")
        words = said.replace(bias_op._qualified_op_name, "").replace("wmma_mm_bias", "")
        if not re.search(r"\bbias\b", words):
            return f"{what}: raised, but not naming the bias: {said[:200]}"

    forward_or_skip(bias_op)
    input_calls = bad_input_calls()
    dtype_calls = {call[0] for call in input_calls}  # their refusal names rule 'dtype'
    calls = bad_bias_calls() + input_calls
    gpu = not why_no_kernel(operator)
    real = {}  # the implementation's verdicts, where it can run
    for what, a, b, bias in calls:
        if {a.device, bias.device} == {"cpu"} or (gpu and a.device == bias.device):
            real[what] = verdict(bias_op, made(a), made(b), made(bias))
    children = [call for call in calls if gpu and call[1].device != call[3].device]
    outcomes = in_child_processes([
        (operator.module.__name__, operator.namespace, a, b, bias) for _, a, b, bias in children])
    real.update(zip((call[0] for call in children), outcomes))
    # out_of_order: the fake let an a or b through, or refused it under no rule of its own
    problems, out_of_order = [], False
    for what, a, b, bias in calls:
        rule = "dtype" if what in dtype_calls else None
        label = what if a.device == bias.device else f"{what} (cuda, in a child process)"
        fake_label = re.sub(r" \((cpu|cuda)\)$", "", what) + f" (fake {a.device})"
        try:
            with FakeTensorMode():
                fake = verdict(bias_op, made(a), made(b), made(bias))
        except UnsupportedOperatorException:
            raise no_fake(operator, bias_op) from None
        said = real.get(what)  # None: the implementation cannot run here
        if said and said[0] == "returned":
            fake_did = "returned too" if fake[0] == "returned" else "raised"
            problems.append(f"{label}: the call returned instead of raising (the fake "
                            f"{fake_did}), giving {said[1]}")
        elif said:
            problems.append(named(label, said[1], rule))
        side = "CUDA" if "cuda" in (a.device, bias.device) else "CPU"
        if fake[0] == "returned" and not (said and said[0] == "returned"):
            where = f", where the {side} implementation raised" if said else ""
            fake_problem = (f"{fake_label}: the call returned instead of raising, giving "
                            f"{fake[1]}{where}")
        elif rule and said and said[0] == fake[0] == "raised" and said[1] != fake[1]:
            # What torch.compile raises is the fake's: it must be what eager raises.
            fake_problem = (f"{fake_label}: the fake raised {fake[1][:200]!r}, where the "
                            f"{side} implementation raised {said[1][:200]!r}")
        elif fake[0] == "raised":
            fake_problem = named(fake_label, fake[1], rule)
        else:  # returned, as the implementation did: said above
            fake_problem = None
        problems.append(fake_problem)
        out_of_order |= bool(rule) and (fake[0] == "returned" or f"'{rule}'" not in fake[1])
    for device in ["cpu"] + ["cuda"] * gpu:
        dtype = torch.float64 if device == "cpu" else torch.half
        a = fresh(256, 2 * op.TILE_K, dtype=dtype, device=device)
        b = fresh(2 * op.TILE_K, op.TILE_N, dtype=dtype, device=device)
        strided = fresh(2 * op.TILE_N, dtype=op.accumulate_dtype(dtype), device=device)[::2]
        said = verdict(bias_op, a, b, strided)
        if said[0] == "raised":
            problems.append(named(f"a strided bias (every second value) ({device})", said[1]))
        elif error_ratio(bias_op(a, b, strided), a, b, strided) > 1.0:
            problems.append(f"a strided bias (every second value) ({device}): the call returned "
                            "a wrong answer instead of raising")
    problems = list(filter(None, problems))
    advice = ["A refusal is a TORCH_CHECK (torch._check in the fake) whose message names the "
              "bias (a and b's: their rule) and what it saw."]
    if out_of_order:
        advice.append(operator.fake_order_hint.format(file=operator.python_name))
    require(not problems, "\n".join(problems + advice))
    asked = len(real) + len(calls) + 1 + gpu
    sides = "cpu, cuda and fake" if gpu else "cpu and fake"
    return (f"{asked} calls ({sides}) refused naming the bias, or read right, and a or b in "
            "float32 naming rule 'dtype'; the fake agrees (for a and b, word for word)")


def exercise_cuda_forward(operator, bias_op):
    require_gpu(operator)
    try:
        return ", ".join(forward_on_gpu(bias_op, *shape, bias=True)
                         for shape in ((256, 512, 384), (512, 1024, 128)))
    except Fail:
        raise
    except Exception as error:
        raise raised(operator, "the forward", error,
                     forward_hint(operator, error, "CUDA")) from None


def exercise_cuda_gradient(operator, bias_op):
    """The CPU rows differentiate the float64 path, this the CUDA one, also with
    grad_bias's entries past FP16's 65504."""
    require_gpu(operator)
    m, k, n, rows = 256, 384, 512, 8192
    inputs = [half(m, k, requires_grad=True), half(k, n, requires_grad=True),
              single(n, requires_grad=True)]
    grad = single(m, n)
    large = 10 + 0.1 * single(rows, n)
    tall = [half(rows, op.TILE_K), half(op.TILE_K, n)]
    try:
        bias_op(*inputs).backward(grad)
        (got,) = torch.autograd.grad(bias_op(*tall, inputs[2]), inputs[2], large)
    except Exception as error:
        raise raised(operator, "the CUDA forward or backward", error) from None
    wide = [to64(t).requires_grad_() for t in inputs]
    torch.addmm(wide[2], wide[0], wide[1]).backward(to64(grad))
    for name, mine, expected in zip(("a", "b", "bias"), inputs, wide):  # tolerance as check 7's
        require(mine.grad is not None, f"the gradient of {name} is None after backward on CUDA: "
                + operator.none_gradient_hint.format(file=operator.python_name))
        error = (to64(mine.grad) - expected.grad).norm() / expected.grad.norm()
        hint = "\n" + operator.exercise_hint.format(number=2) if name == "bias" else ""
        require(error <= 1e-2, f"the gradient of {name} on CUDA at {m}x{k}x{n} is off by "
                f"{error:.2e} in norm (bound 1e-2){hint}")
    # In FP32 each entry is within 8192 * 2^-24 = 5e-4 of float64, relatively.
    (expected,) = torch.autograd.grad(torch.addmm(wide[2], *map(to64, tall)), wide[2], to64(large))
    worst = ((to64(got) - expected).abs() / expected).max().item()  # inf or NaN fails
    near = f"{expected.mean().item():.0f}"
    require(worst <= rows * 2.0**-24,
            f"with grad_bias's entries near {near} (FP16 stops at 65504), grad_bias on CUDA is "
            f"off by {worst:.1e}: it passed through FP16. Keep it in grad's dtype.")
    return f"grads of a, b, bias match float64; grad_bias right with entries near {near}"


def check_autograd(operator, device):
    """Failure modes: with no backward the output has no grad_fn and parameters before
    the op get no grad; a and b saved or unpacked in the wrong order fail only a or only b."""
    if device == "cuda":
        require_gpu(operator)
    # On CUDA, FP16 inputs and gradients (2^-11 each) and FP32 sums: about 1e-3 in norm;
    # a wrong formula is off by order 1.
    (m, k, n, dtype), tolerance = (((128, 32, 256, torch.half), 1e-2) if device == "cuda"
                                   else ((4, 3, 5, torch.float64), 1e-10))
    for wants in ("only a", "only b", "a and b"):
        x = fresh(m, k, dtype=dtype, device=device)
        params = {
            "upstream": fresh(m, k, dtype=dtype, device=device, requires_grad=wants != "only b"),
            "weight": fresh(k, n, dtype=dtype, device=device, requires_grad=wants != "only a"),
            "downstream": fresh(n, dtype=op.accumulate_dtype(dtype), device=device,
                                requires_grad=True)}
        wide = {name: to64(p).requires_grad_(p.requires_grad) for name, p in params.items()}
        c = operator.wrapper(x * params["upstream"], params["weight"])
        require(c.grad_fn is not None, "the op's output has no grad_fn: the graph ends at the op")
        (torch.tanh(c) * params["downstream"]).sum().backward()
        upstream = to64(x) * wide["upstream"]
        (torch.tanh(upstream @ wide["weight"]) * wide["downstream"]).sum().backward()
        for name, p in params.items():
            if p.requires_grad:
                require(p.grad is not None, f"{wants} want gradients: '{name}' received none")
                error = (to64(p.grad) - wide[name].grad).norm() / wide[name].grad.norm()
                require(error <= tolerance,
                        f"{wants} want gradients: '{name}' is off by {error:.2e}")
    return "only a, only b, both: every gradient matches float64"


def without_autograd_cache():
    """torch.compile's on-disk autograd cache can serve a backward compiled before an edit
    of _backward (pytorch#144344): the compile rows switch it off for their own compiles.
    A patch of torch's config, undone as the row ends: importing this file changes nothing,
    neither torch's settings nor the environment, for a program that imports it."""
    from torch._functorch import config  # torch 2.11 and 2.14 name the switch alike
    if not hasattr(config, "enable_autograd_cache"):  # a torch older than the cache
        return contextlib.nullcontext()
    return config.patch(enable_autograd_cache=False)


def check_compile(operator, device):
    """Failure modes: with no fake the graph splits; a fake's bare torch._check says
    only "Expected cond to be True"; a TypeError in a fake logs a wall of text."""
    with without_autograd_cache():
        return compile_questions(operator, device)


def compile_questions(operator, device):  # check_compile's, with the autograd cache off
    mm = operator.wrapper
    from torch._dynamo.testing import CompileCounterWithBackend
    from torch._dynamo.utils import counters

    if device == "cuda":
        require_gpu(operator)
    # Distinct M, K, N: Dynamo gives equal sizes one symbol and would recompile.
    dtype, shapes = ((torch.half, [(128, 32, 256), (256, 64, 384)]) if device == "cuda"
                     else (torch.float64, [(4, 3, 5), (6, 7, 2)]))
    report = []
    for dynamic in (False, True):
        torch._dynamo.reset()
        counters.clear()
        # aot_eager traces with fake tensors as inductor would, but runs eager's kernels.
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
        breaks = sum(counters["graph_break"].values())
        kind = "dynamic" if dynamic else "static"
        require(counter.frame_count == 1 and breaks == 0,
                f"{kind}: {counter.frame_count} graphs, {breaks} breaks")
        report.append(f"{kind}: 1 graph, 0 breaks")
    # Not contiguity or alignment: a fake's strides may not be eager's; it has no address.
    calls = [call for call in contract_calls(device)
             if call[2] not in ("contiguous", "alignment") and call[0] is not None]
    records = []
    recorder = logging.Handler(logging.WARNING)
    recorder.emit = records.append
    logging.getLogger("torch").addHandler(recorder)
    try:
        for a, b, rule in calls:
            eager = expect_raise(mm, a, b, rule).splitlines()[0]
            torch._dynamo.reset()
            compiled = expect_raise(torch.compile(mm, backend="aot_eager", fullgraph=True),
                                    a, b, rule)
            require(eager in compiled,
                    f"rule '{rule}': eager says {eager!r}, compiled says {compiled[:300]!r}")
    finally:
        logging.getLogger("torch").removeHandler(recorder)
    if records:
        raise Fail(f"{len(records)} log lines while compiling, e.g. "
                   f"{records[0].getMessage()[:200]!r}")
    report.append(f"equal to eager; {len(calls)} rules fail with eager's message, no log")
    return "; ".join(report)


def check_stream_order(operator):
    """Failure mode: a kernel launched on another stream (the legacy default, say)
    runs during the sleep and reads the old inputs."""
    require_gpu(operator)
    a, b, new_a, new_b = (half(256, 256) for _ in range(4))
    torch.cuda.synchronize()
    with torch.cuda.stream(torch.cuda.Stream()):
        torch.cuda._sleep(100_000_000)
        a.copy_(new_a)
        b.copy_(new_b)
        c = operator.wrapper(a, b)
    torch.cuda.synchronize()
    ratio = error_ratio(c, new_a, new_b)
    require(ratio <= 1.0, f"result does not match the inputs written on the stream "
            f"({100 * ratio:.3g}% of bound): the kernel ran before them")
    return f"{100 * ratio:.1f}% of bound after a 50 ms producer"


def check_profiler(operator):
    """The next lesson reads this profile. Failure mode: a call that is not the
    registered op (a raw kernel wrapper, torch.mm) has no event of its name."""
    mm = operator.wrapper
    require_gpu(operator)
    from torch.profiler import ProfilerActivity, profile

    a, b = half(256, 128), half(128, 512)
    mm(a, b)  # first-call costs stay out
    torch.cuda.synchronize()
    with warnings.catch_warnings():  # torch's notice about profiler cycles
        warnings.simplefilter("ignore", UserWarning)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as profiler:
            mm(a, b)
            torch.cuda.synchronize()
    op_events = [e for e in profiler.events() if e.name == operator.name]
    require(op_events, f"no {operator.name} event in the profile")

    def kernels_under(event):
        return [k.name for k in event.kernels] + [
            name for child in event.cpu_children for name in kernels_under(child)]

    kernels = [name for e in op_events for name in kernels_under(e)]
    require(any(operator.kernel in name for name in kernels),
            f"no {operator.kernel} attributed to {operator.name} (its kernels: {kernels})")
    return f"{operator.name} -> {operator.kernel}"


def check_no_host_sync(operator):
    """Failure modes: a .item(), a print of a CUDA value, a stream synchronize (sync
    debug mode 'error' raises); a device synchronize (which it misses). So each call
    is queued behind GPU sleep: one that waited returns after the sleep has ended."""
    mm = operator.wrapper
    require_gpu(operator)
    a, b = half(128, 64, requires_grad=True), half(64, 256, requires_grad=True)
    grad = single(128, 256)
    mm(a, b).backward(grad)  # first-call costs stay out
    torch.cuda.synchronize()
    c = mm(a, b)
    for phase, call in (("forward", lambda: mm(a, b)), ("backward", lambda: c.backward(grad))):
        torch.cuda.synchronize()
        torch.cuda._sleep(SLEEP_CYCLES)
        # Ends with the sleep. Not "is the stream idle?": a call that waited for the
        # GPU and then launched leaves its own work queued there.
        slept = torch.cuda.Event()
        slept.record()
        with warnings.catch_warnings():  # "sync debug mode is a prototype feature"
            warnings.simplefilter("ignore", UserWarning)
            torch.cuda.set_sync_debug_mode("error")
            try:
                call()
            finally:
                torch.cuda.set_sync_debug_mode("default")
        waited = slept.query()
        torch.cuda.synchronize()
        require(not waited, f"the {phase} returned only after the GPU sleep queued before it "
                "had ended: it waited for the GPU (a device-wide synchronize, a "
                "stream synchronize, or a value read back)")
    require(a.grad is not None and b.grad is not None, "backward produced no gradients")
    return "forward and backward returned with the GPU busy, under sync debug mode 'error'"


# About 100 ms on an H200 (125 ms on a T4): far longer than a call's host time.
SLEEP_CYCLES = 200_000_000


def check_device_guard(operator):
    """Failure mode: without the CUDAGuard the output is allocated on the current
    device, cuda:0, or the launch fails."""
    mm = operator.wrapper
    require_gpu(operator, count=2)
    torch.cuda.set_device(0)
    a = half(256, 128, device="cuda:1", requires_grad=True)
    b = half(128, 512, device="cuda:1", requires_grad=True)
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
    expect_raise(mm, half(256, 128, device="cuda:0"), b.detach(), "one device")
    return f"output and gradients on cuda:1, {100 * ratio:.1f}% of bound, current device still 0"


def check_backward_accuracy(operator):
    """Tiny gradients give subnormal FP16 results; padded rows, as torch.cat([c1, c2],
    dim=1) hands c1, catch a backward that reads them as dense."""
    require_gpu(operator)
    m, k, n = 256, 384, 512
    report = []
    for regime in ("1e-7..1e-5", "randn", "padded rows"):
        a, b = half(m, k, requires_grad=True), half(k, n, requires_grad=True)
        grad = torch.randn(m, n + 8 * (regime == "padded rows"), device="cuda")[:, :n]
        if regime == "1e-7..1e-5":
            grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
        operator.wrapper(a, b).backward(grad)
        worst = max(error_ratio(a.grad, grad, b.t()), error_ratio(b.grad.t(), grad.t(), a))
        require(worst <= 1.0, f"{regime}: {100 * worst:.3g}% of the bound")
        report.append(f"{regime}: {100 * worst:.1f}%" + (" of bound" if not report else ""))
    return "; ".join(report)


# --- Row 14: the standalone gate, built with nvcc alone and run ---
# The lesson's gate takes about a second on an H200, fast/'s about twenty: a gate still
# running after this long waits on something that never comes (a kernel that never ends).
GATE_TIME_LIMIT = 120  # seconds


def check_gate(operator):
    """gate.cu calls the launcher too: a change to its parameters must reach it, and a call
    that compiles can still be wrong (two arguments swapped). So gate.cu is built for one
    architecture (the card's, or sm_75 where none is visible), linked, and where a GPU is
    visible run; only the gate's own PASS line passes."""
    home = operator.build["cuda_home"]
    nvcc = os.path.join(home, "bin", "nvcc") if home else shutil.which("nvcc")
    if not nvcc:
        raise Skip("no nvcc")
    visible = torch.cuda.is_available()  # the gate needs no extension, only a card
    architecture = "sm_{}{}".format(*torch.cuda.get_device_capability(0)) if visible else "sm_75"
    gate, runtime = build_gate(operator, nvcc, architecture)
    built = f"gate.cu built for {architecture} and linked ({runtime})"
    if not visible:
        return f"{built}; not run: no GPU visible"
    try:
        ran = subprocess.run([gate], capture_output=True, text=True, timeout=GATE_TIME_LIMIT)
    except subprocess.TimeoutExpired as late:  # its output as bytes, whatever text= says
        printed = (late.stdout or b"").decode(errors="replace").strip().splitlines()
        raise Fail(f"the gate did not finish in {GATE_TIME_LIMIT} s and was killed: a kernel "
                   "that never ends, or a wait that never returns"
                   + (f"; its last line: {printed[-1]!r}" if printed else "")) from None
    if ran.returncode == 0 and "gate: PASS" in ran.stdout.splitlines():
        return f"{built}, run: gate: PASS"
    # What a failed run of the gate most often means while the exercise is being done.
    hint = operator.gate_hint.format(launcher=operator.launcher,
                                     launcher_file=operator.launcher_file)
    raise Fail(f"the gate ran and failed: {what_the_gate_said(ran)}\n{hint}")


def what_the_gate_said(ran):
    """Its first failing line, the fault it exited on (CUDA_CHECK's line, on stderr), the
    signal that killed it; else how it ended without its PASS line."""
    lines = ran.stdout.splitlines()
    said = [line.strip() for line in lines if "FAIL" in line and line != "gate: FAIL"][:1]
    said += [line.strip() for line in ran.stderr.splitlines() if line.strip()][:1]
    if ran.returncode < 0:  # stdout's buffer dies with it: what it printed last may be lost
        said.append(f"killed by {signal.Signals(-ran.returncode).name}")
    if not said:
        said.append(f"exit {ran.returncode}, "
                    + (f"its last line {lines[-1]!r}" if lines else "and it printed nothing"))
    return "; ".join(said)


def build_gate(operator, nvcc, architecture):
    """The gate's executable, built once per text of gate.cu and what it includes, compiler
    and architecture, in the build cache beside the extension's folder; and how it links
    the CUDA runtime, in words."""
    source, toolkit = operator.gate_source, operator.build["toolkit"] or {}
    # pip's toolkit keeps its headers in folders of their own
    headers = [f"-I{path}" for path in toolkit.get("include", [])]
    target = operator.gate_target(architecture)
    key = hashlib.sha256("\0".join([nvcc, *target]).encode())
    for path in gate_inputs(nvcc, [*target, *headers], source):
        # named from gate.cu's folder: two copies of one folder share one gate
        name = os.path.relpath(path, os.path.dirname(source))
        key.update(name.encode() + b"\0" + pathlib.Path(path).read_bytes())
    folder = os.path.join(os.path.dirname(operator.build["directory"]),
                          f"{operator.namespace}-gate-{key.hexdigest()[:16]}")
    gate = os.path.join(folder, "gate")
    os.makedirs(folder, mode=0o700, exist_ok=True)
    op.refuse_unless_private(folder, gate)  # a program this row runs: nobody else's
    link, runtime = runtime_link_flags(toolkit, folder)
    if not os.path.exists(gate):
        # Under a name of its own until it is whole: a build killed midway, or another
        # process building the same gate at once, leaves no half-written "gate"
        partial = f"{gate}.{os.getpid()}.partial"
        built = subprocess.run([nvcc, "-O3", *target, *headers, *link, "-o",
                                partial, os.path.basename(source)],
                               capture_output=True, text=True, cwd=os.path.dirname(source))
        linker = [line for line in built.stderr.splitlines() if re.search(r"\bld: ", line)]
        require(built.returncode == 0 or not linker,
                f"gate.cu compiles and does not link: {linker[0] if linker else ''}")
        hint = operator.gate_compile_hint.format(launcher=operator.launcher,
                                                 launcher_file=operator.launcher_file)
        require(built.returncode == 0,
                f"gate.cu does not compile: {op.first_compiler_error(built.stderr)}\n{hint}")
        os.replace(partial, gate)
    return gate, runtime


def gate_inputs(nvcc, flags, source):
    """gate.cu and every file it includes, wherever they are, as nvcc's preprocessor finds
    them: the prerequisites of the make rule that -MM prints ("gate.o : gate.cu kernel.cu
    ..."), its lines joined, a space in a name escaped. Where that fails, every CUDA file
    in gate.cu's folder (the build that follows says why it failed)."""
    folder = os.path.dirname(source)
    rule = subprocess.run([nvcc, "-MM", *flags, os.path.basename(source)], capture_output=True,
                          text=True, cwd=folder)
    if rule.returncode != 0 or ":" not in rule.stdout:
        return sorted(str(path) for path in pathlib.Path(folder).glob("*.cu*"))
    words = re.split(r"(?<!\\)\s+", rule.stdout.split(":", 1)[1].replace("\\\n", " "))
    return sorted({os.path.join(folder, word.replace("\\ ", " ")) for word in words if word})


def runtime_link_flags(toolkit, folder):
    """nvcc links the CUDA runtime statically, from its toolkit's lib64. pip's wheels keep
    it in lib/, where nvcc does not look, so that folder is named; a toolkit with no static
    runtime at all gets the shared one, which no loader would find in pip's folder without
    the rpath. A toolkit op.py did not find (nvcc on PATH) links as nvcc does by default.
    Returns the flags, and how the gate links, in words."""
    roots = [toolkit["home"], *map(os.path.dirname, toolkit["include"])] if toolkit else []
    libraries = [path for root in dict.fromkeys(roots) for path in
                 (os.path.join(root, "lib64"), os.path.join(root, "lib")) if os.path.isdir(path)]
    static = [path for path in libraries if os.path.exists(f"{path}/libcudart_static.a")]
    if static:
        return [f"-L{static[0]}"], "static CUDA runtime"
    shared = toolkit.get("cudart") or next(
        (f"{path}/libcudart.so" for path in libraries if os.path.exists(f"{path}/libcudart.so")),
        None)
    if not shared:
        return [], "the CUDA runtime as nvcc links it"
    # -cudart shared links -lcudart, which wants a libcudart.so: pip has only libcudart.so.13
    os.makedirs(named := os.path.join(folder, "cudart"), exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.symlink(os.path.realpath(shared), os.path.join(named, "libcudart.so"))
    runtime = os.path.dirname(os.path.realpath(shared))
    return (["-cudart", "shared", f"-L{named}", *(f"-L{path}" for path in libraries),
             f"-Xlinker=-rpath={runtime}"], "shared CUDA runtime, by rpath")


# --- The table, top to bottom ---
def lesson_rows(operator=LESSON):
    def row(name, compares, check, *arguments):
        return name, compares, lambda: check(operator, *arguments)

    refusals = "calls that must raise, naming their rule"
    forward = "kernel vs float64 CPU reference"
    schema = "schema, fake impl, autograd registration"
    grads = "only a, only b, both: grads vs float64"
    graph = "fwd+bwd vs eager; errors as eager's"
    return [
        row("1 contract, cpu", refusals, check_contract, "cpu"),
        row("1 contract, cuda", refusals, check_contract, "cuda"),
        row("2 forward 256x512x384", forward, check_forward, 256, 512, 384),
        row("2 forward 512x1024x128", forward, check_forward, 512, 1024, 128),
        row("3 opcheck, cpu f64", schema, check_opcheck, "cpu"),
        row("3 opcheck, cuda f16", schema, check_opcheck, "cuda"),
        row("4 gradcheck", "registered formula vs numerical Jacobian", check_gradcheck),
        row("5 gradcheck rejects", "a grad_a scaled by 1.01 must raise", check_gradcheck_rejects),
        *exercise_rows(operator),
        row("7 autograd, cpu f64", grads, check_autograd, "cpu"),
        row("7 autograd, cuda f16", grads, check_autograd, "cuda"),
        row("8 torch.compile, cpu f64", graph, check_compile, "cpu"),
        row("8 torch.compile, cuda f16", graph, check_compile, "cuda"),
        row("9 stream order", "inputs written late on a side stream", check_stream_order),
        row("10 profiler", f"{operator.name} with its kernel under it", check_profiler),
        row("11 no host sync", "fwd+bwd return before the sleep ahead ends", check_no_host_sync),
        row("12 device guard", "call on cuda:1 from current device 0", check_device_guard),
        row("13 backward accuracy", "grads: tiny, randn, padded rows vs float64",
            check_backward_accuracy),
        row("14 gate.cu", "the launcher's third caller: built, linked, run", check_gate),
    ]


def print_provenance(operator=LESSON):
    built = operator.build
    nvcc = "not found"
    if built["cuda_home"]:
        nvcc = subprocess.run([os.path.join(built["cuda_home"], "bin", "nvcc"), "--version"],
                              capture_output=True, text=True).stdout.strip()
    devices = [f"device {i}: {torch.cuda.get_device_name(i)}, "
               f"capability {torch.cuda.get_device_capability(i)}"
               for i in range(torch.cuda.device_count())] or ["device: no GPU visible"]
    print(f"date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
          f"python {platform.python_version()}, torch {torch.__version__}, "
          f"built for CUDA {torch.version.cuda}",
          f"torch.cuda.get_arch_list(): {torch.cuda.get_arch_list()}",
          "nvcc --version:\n    " + nvcc.replace("\n", "\n    "), *devices,
          f"operator: {operator.name}, from {operator.folder}",
          f"extension: {'CUDA + CPU' if built['with_cuda'] else 'CPU only'}, "
          f"architectures {built['archs']}: {built.get('library') or built['directory']}\n",
          sep="\n")


def main(operator=LESSON):
    # A crash in native code prints its Python stack, not just "Segmentation fault".
    faulthandler.enable()
    print_provenance(operator)
    reason = why_no_kernel(operator)
    notes = [f"the CUDA kernel was not run: {reason}"] if reason else []
    sys.exit(0 if run_table(lesson_rows(operator), notes) else 1)


if __name__ == "__main__":
    main()
