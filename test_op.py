"""test_op.py: the day 87 harness. A plain script: provenance, then the lesson's table.

    python test_op.py

Each row prints pass, FAIL or skip with its reason; the last line is
"N passed, N failed, N skipped", and the exit status is 1 if anything failed.
Checks 1 to 6 are the lesson's; 7 to 15 prove the rest of what it promises.
Without a GPU the CUDA rows skip, the CPU rows still run, and the line before the
last says that the kernel was not run. checks/self_test.py runs every row
against a deliberately wrong operator and requires each to fail.

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
import inspect  # noqa: E402
import logging  # noqa: E402
import math  # noqa: E402
import os  # noqa: E402
import platform  # noqa: E402
import re  # noqa: E402
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
    bias_wrapper: object = None  # check 6's wrapper; None: wmma_mm_bias in python_file's module

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
    def exercise_wrapper(self):  # op.wmma_mm_bias, or None where python_file defines none
        if self.bias_wrapper is not None:
            return self.bias_wrapper
        module = next((module for module in list(sys.modules.values())
                       if os.path.abspath(getattr(module, "__file__", None) or "") == os.path.abspath(self.python_file)),
                      None)
        return getattr(module, "wmma_mm_bias", None)

    @property
    def folder(self):
        return os.path.dirname(os.path.abspath(self.python_file))

    def with_wrapper(self, wrapper):  # the same operator called through another function
        return dataclasses.replace(self, wrapper=wrapper)


LESSON = Operator(wrapper=op.wmma_mm, name="day87::wmma_mm", kernel="wmmaGemmKernel", build=op.BUILD,
                  python_file=op.__file__)


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
    "the later CUDA rows cannot run. Doing the exercise? wmma_mm passes no bias (nullptr), so "
    "storeOutputs in kernel.cu may add operands.bias only where it is set.")


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


def error_ratio(result, a, b, extra=None, rounded_left=False):
    """Worst |result - reference| / bound over all elements, in float64: 1.0 is the
    edge. The reference is a @ b (+ extra) in float64 from the same values.

    The bound, derived here once (README.md, gate.cu and checks/ point to it):
    FP16 x FP16 products are exact in FP32 (11 + 11 significand bits fit in 24),
    so all error comes from adding K products in FP32: in any order, with
    round-to-nearest, |error| <= (K - 1) * 2^-24 * sum_p |a_ip b_pj|. Tensor cores
    may truncate rather than round, so allow 2^-23 per addition:
        bound_ij = K * 2^-23 * (|A| @ |B|)_ij        (float64: 2^-51 per addition)
    A result stored in FP16 (a gradient) is rounded once more: half an FP16 ulp,
    2^-11 relative, or 2^-25 absolute where it is subnormal. rounded_left: `a` was
    rounded to FP16 after an exact power-of-two scaling that put its largest
    element in [2^14, 2^15) (a backward on tensor cores that scales grad into FP16): 2^-11 relative per element, or
    max|a| * 2^-39 absolute where the scaled element is subnormal."""
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
    if rounded_left:
        largest = a64.abs().max() if a64.numel() else 0.0  # an empty `a` has no largest
        bound += 2.0**-11 * magnitude + 2.0**-39 * largest * b64.abs().sum(0)
    if result.dtype == torch.half:
        bound += 2.0**-11 * reference.abs() + 2.0**-25
    return ((result64 - reference).abs() / bound).max().item()


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
    return f"{len(calls)} calls raised, each naming its rule" + ("; a valid call still works" if device == "cuda" else "")


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
    ratio = error_ratio(c, a, b, extra)
    require(ratio <= 1.0, f"error is {100 * ratio:.1f}% of the bound")
    return f"{100 * ratio:.1f}% of bound"


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
    except GradcheckError as error:
        raise Fail(f"gradcheck: {str(error).splitlines()[0]}") from None
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
def jacobian_mismatches(fn, inputs, names, epsilon=1e-6, limit=4):
    """Analytical (backward) against numerical (central difference) Jacobians of
    fn at float64 inputs: one line per input whose Jacobians disagree, naming the
    worst entries d out[i][j] / d input[index]."""
    inputs = [x.detach().requires_grad_() for x in inputs]
    out = fn(*inputs)
    problems = [] if out.grad_fn else ["the output has no grad_fn: no backward is registered"]
    for which, (x, name) in enumerate(zip(inputs, names)):
        def moved(step, element):
            shifted = [t.detach().clone() for t in inputs]
            shifted[which].view(-1)[element] += step
            return fn(*shifted).reshape(-1)

        numerical = torch.stack([(moved(epsilon, e) - moved(-epsilon, e)) / (2 * epsilon)
                                 for e in range(x.numel())], dim=1)
        analytical = torch.zeros_like(numerical)
        for o in range(out.numel() if out.grad_fn else 0):
            analytical[o] = torch.autograd.grad(out.reshape(-1)[o], x, retain_graph=True, allow_unused=True,
                                                materialize_grads=True)[0].reshape(-1)
        error = (analytical - numerical).abs()
        wrong = error > 1e-5 + 1e-3 * numerical.abs()
        if wrong.any():
            worst = sorted(wrong.nonzero().tolist(), key=lambda entry: -error[tuple(entry)])[:limit]
            entries = [f"d out[{o // out.shape[1]}][{o % out.shape[1]}]/d {name}"
                       f"{list(divmod(e, x.shape[1])) if x.dim() == 2 else [e]}: "
                       f"analytical {analytical[o, e]:.4g}, numerical {numerical[o, e]:.4g}" for o, e in worst]
            problems.append(f"{name}: {int(wrong.sum())} of {wrong.numel()} Jacobian entries wrong, e.g. "
                            + "; ".join(entries))
    return problems


def where_raised(operator, error):
    """' (op.py:123, in _backward_bias)': the innermost line that the error passed
    through in a file of the operator's folder other than this one (its Python
    file, mostly), or ''."""
    frames = [frame for frame in traceback.extract_tb(error.__traceback__)
              if os.path.dirname(os.path.abspath(frame.filename)) == operator.folder
              and os.path.abspath(frame.filename) != os.path.abspath(__file__)]
    return f" ({os.path.basename(frames[-1].filename)}:{frames[-1].lineno}, in {frames[-1].name})" if frames else ""


def where_defined(function):
    """' (op.py:123, _backward_bias)': where a Python function is defined, or ''."""
    try:
        _, line = inspect.getsourcelines(function)
        return f" ({os.path.basename(inspect.getsourcefile(function))}:{line}, {function.__name__})"
    except (TypeError, OSError):
        return ""


def first_call_in_folder(operator, run):
    """run() under a profile hook: (the code of the first function of the operator's
    folder that it calls, or None; what it raised, or None). For a run that is a
    backward, that function is the registered backward: autograd's engine runs a CPU
    graph's backward on the calling thread, where the hook sees it."""
    seen, error = [], None

    def hook(frame, event, argument):
        if (event == "call" and not seen and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == operator.folder
                and os.path.abspath(frame.f_code.co_filename) != os.path.abspath(__file__)):
            seen.append(frame.f_code)

    previous = sys.getprofile()
    sys.setprofile(hook)
    try:
        run()
    except RuntimeError as raised_there:
        error = raised_there
    finally:
        sys.setprofile(previous)
    return (seen[0] if seen else None), error


def raised(operator, what, error, hint=""):
    """A failure for an exception from the student's code: its type, first line and place."""
    first_line = (str(error).splitlines() or [""])[0]
    return Fail(f"{what} raised {type(error).__name__}{where_raised(operator, error)}: {first_line}"
                + (hint and f"\n{hint}"))


def require_implementation(operator, bias_op, key):
    """The schema is there (check 6 found the op); a kernel for `key` must be too."""
    name = bias_op._qualified_op_name
    if torch._C._dispatch_has_kernel_for_dispatch_key(name, key):
        return
    # An m.impl whose name has no schema loads without an error: name it.
    dangling = [found for impl in torch._C._dispatch_find_dangling_impls()
                for found in re.findall(rf"name: ({operator.namespace}\w*::\w+)", impl)]
    block = f"TORCH_LIBRARY_IMPL({name.split('::')[0]}, {key}, m)"
    raise Fail(f"{name} has a schema but no {key} implementation. Fix: in binding.cpp's {block}, "
               f'm.impl("{name.split("::")[1]}", ...), the name spelled as in the schema'
               + (f"; these implementations name no schema: {'; '.join(dangling)}" if dangling else ""))


def exercise_forward(operator, bias_op):
    require_implementation(operator, bias_op, "CPU")
    # Both a non-square and a square shape: with M != N a bias broadcast along
    # the wrong axis raises; with M == N it silently adds the wrong values.
    for m, k, n in [(3, 4, 5), (5, 4, 5)]:
        a, b, bias = fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64), fresh(n, dtype=torch.float64)
        try:
            c = bias_op(a, b, bias)
        except Exception as error:
            raise raised(operator, f"{m}x{k}x{n}: the forward", error) from None
        ratio = error_ratio(c, a, b, bias)
        require(ratio <= 1.0, f"{m}x{k}x{n}: the forward disagrees with a @ b + bias "
                              f"({ratio:.3g} x the float64 bound)")
    return "agrees with a @ b + bias at 3x4x5 and 5x4x5"


# The bias's rules, in the README's order: its device, then a and b's own rules
# (wmma_mm's contract), then its shape ('bias'), dtype, and contiguity. Each bad call:
# (what is wrong, a, b, bias, the rule that must be named, whether the message must
# name the bias). A call that breaks two rules must name the first in that order.
def bias_contract_calls(device):
    if device == "cpu":
        f64, a, b = torch.float64, fresh(3, 4, dtype=torch.float64), fresh(4, 5, dtype=torch.float64)
        return [("a bias of length N + 1", a, b, fresh(6, dtype=f64), "bias", True),
                ("a 2-D bias", a, b, fresh(1, 5, dtype=f64), "bias", True),
                ("a torch.float32 bias", a, b, fresh(5, dtype=torch.float32), "dtype", True),
                ("a strided bias", a, b, fresh(10, dtype=f64)[::2], "contiguous", True),
                ("a and b's inner dimensions differ, and the bias's length", a, fresh(7, 5, dtype=f64),
                 fresh(6, dtype=f64), "inner dimensions", False),
                ("a torch.float32 bias of length N + 1", a, b, fresh(6, dtype=torch.float32), "bias", True),
                ("a strided torch.float32 bias", a, b, fresh(10, dtype=torch.float32)[::2], "dtype", True)]
    # On CUDA, or on fake CUDA tensors: FP16 a and b, an FP32 bias.
    m, k, n = 2 * op.TILE_M, 3 * op.TILE_K, 3 * op.TILE_N
    a = torch.empty(m, k, dtype=torch.half, device="cuda")
    b = torch.empty(k, n, dtype=torch.half, device="cuda")
    return [("a bias on the CPU", a, b, torch.empty(n), "one device", True),
            ("a bias on the CPU, and a in torch.float32", a.float(), b, torch.empty(n), "one device", True),
            ("a bias of length N + 1", a, b, torch.empty(n + 1, device="cuda"), "bias", True),
            ("a torch.float16 bias", a, b, torch.empty(n, dtype=torch.half, device="cuda"), "dtype", True),
            ("a torch.float16 bias of length N + 1", a, b, torch.empty(n + 1, dtype=torch.half, device="cuda"),
             "bias", True)]


def bias_contract_problem(bias_op, what, a, b, bias, rule, names_bias):
    """None where the call raised naming the rule (and the bias, and the operator),
    else what is wrong."""
    name = bias_op._qualified_op_name
    try:
        bias_op(a, b, bias)
    except UnsupportedOperatorException:
        raise
    except (RuntimeError, ValueError, TypeError) as error:
        said = (str(error).splitlines() or [""])[0]
        # The bias by name, outside the operator's own name, which holds "bias" too: a
        # bias rule worded as a and b's ("a and b must be ...") blames the wrong inputs.
        names_the_bias = re.search(r"\bbias\b", said.replace(name, ""))
        missing = [word for word, found in ((f"'{rule}'", f"'{rule}'" in said), ("the bias", names_the_bias),
                                            (name, name in said))
                   if not found and (word != "the bias" or names_bias)]
        if not missing:
            return None
        named = re.search(r"rule '([^']+)'", said)
        if named and named.group(1) != rule:
            return (f"{what}: raised naming rule '{named.group(1)}', where the README's order names "
                    f"'{rule}' first: {said[:200]}")
        return f"{what}: raised, but its message lacks {', '.join(missing)}: {said[:200]}"
    return f"{what}: the call returned instead of raising rule '{rule}'"


def exercise_contract(operator, bias_op):
    """The bias's contract, eager on the CPU and under the fake on fake CUDA tensors
    (no GPU needed): the same rules, in the same order, with the same messages.
    Not eager on CUDA: a CUDA implementation without one of the checks would launch
    on a bias it cannot read (a host pointer, too few bytes), fault, and break the
    CUDA context for every later row; the fake asks the same questions safely."""
    require_implementation(operator, bias_op, "CPU")
    name = bias_op._qualified_op_name
    problems = {"eager": [], "fake": []}
    for what, a, b, bias, rule, names_bias in bias_contract_calls("cpu"):
        problems["eager"].append(bias_contract_problem(bias_op, what + " (cpu)", a, b, bias, rule, names_bias))
    # A fake that raises something other than a rule's error logs its traceback at
    # every call; the row's message carries what matters.
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    was_disabled, fake_log.disabled = fake_log.disabled, True
    try:
        with FakeTensorMode():
            for call in bias_contract_calls("cuda"):
                problems["fake"].append(bias_contract_problem(bias_op, call[0] + " (fake cuda)", *call[1:]))
    except UnsupportedOperatorException:
        raise Fail(NO_FAKE.format(name=name, file=operator.python_name)) from None
    finally:
        fake_log.disabled = was_disabled
    fixes = {"eager": f"in binding.cpp, the bias's checks in {name}'s implementations (a TORCH_CHECK a rule, "
                      "in the README's order: its device, a and b's rules, its length, its dtype, contiguity)",
             "fake": f"in {operator.python_name}'s fake for {name}: the same checks, order and messages "
                     "(torch._check with a message; not contiguity)"}
    report = [f"{len(found)} {kind} calls" for kind, found in problems.items()]
    failures = [f"{problem}\nFix: {fixes[kind]}" for kind, found in problems.items() for problem in found if problem]
    require(not failures, "\n".join(failures))
    return f"{' and '.join(report)} raised, each naming its rule, the bias and {name}"


def exercise_wrapper(operator, bias_op):
    """The Python wrapper beside wmma_mm, the schema's arguments, and a call by keyword."""
    name = bias_op._qualified_op_name
    arguments = [argument.name for argument in bias_op.default._schema.arguments]
    require(arguments == ["a", "b", "bias"],
            f"the schema's arguments are ({', '.join(arguments)}): a call by keyword, "
            f"{name.split('::')[1]}(a=..., b=..., bias=...), reaches the wrong ones. Fix: in binding.cpp, "
            f'm.def("{name.split("::")[1]}(Tensor a, Tensor b, Tensor bias) -> Tensor")')
    wrapper = operator.exercise_wrapper
    require(wrapper is not None,
            f"{operator.python_name} has no wmma_mm_bias: the README asks for it, and the tools and day 88 "
            f"call it. Fix: in {operator.python_name}, beside wmma_mm, def wmma_mm_bias(a, b, bias) that "
            f"returns {name}(a, b, bias)")
    a, b, bias = fresh(3, 4, dtype=torch.float64), fresh(4, 5, dtype=torch.float64), fresh(5, dtype=torch.float64)
    try:
        positional = bias_op(a, b, bias)
    except Exception as error:
        raise Skip(f"the forward raises at 3x4x5 ({type(error).__name__}), so there is no result to "
                   "compare the wrapper's with: fix the forward first") from None
    try:
        by_keyword, wrapped = bias_op(a=a, b=b, bias=bias), wrapper(a, b, bias)
    except Exception as error:
        raise raised(operator, "a call by keyword, or through the wrapper, at 3x4x5", error) from None
    require(torch.equal(by_keyword, positional), "a call by keyword (a=, b=, bias=) gives another result than "
                                                 "a positional one")
    require(torch.is_tensor(wrapped) and wrapped.shape == positional.shape and torch.equal(wrapped, positional),
            f"{operator.python_name}'s wmma_mm_bias(a, b, bias) does not give {name}(a, b, bias)'s result"
            f"{where_defined(wrapper)}: it should return {name}(a, b, bias) as it is")
    return f"{operator.python_name}'s wmma_mm_bias agrees; schema (a, b, bias); by keyword as positional"


# The usual cause of a backward that raises: setup_context saved other tensors, or
# another number of them, than the backward unpacks.
SAVED_TENSORS_HINT = ("In {file}, setup_context saves and the backward unpacks ctx.saved_tensors: the same "
                      "tensors in the same order (wmma_mm's _backward unpacks a, b as _setup_context saves them).")


NO_BACKWARD = ("no backward is registered for {name}: on the CPU autograd records the float64 kernel's "
               "own ATen ops and only warns, on CUDA the gradients stay None, the lesson's pitfall "
               "'training runs, but the loss does not move'. Fix: in {file}'s _register, "
               'torch.library.register_autograd("{name}", backward, setup_context=..., lib=library)')


def exercise_gradient(operator, bias_op):
    require_implementation(operator, bias_op, "CPU")
    name = bias_op._qualified_op_name
    # The registration first: autograd's fallback records a CPU kernel built from
    # ATen ops (at::addmm), so the Jacobians below agree even with no backward.
    inputs = [fresh(*shape, dtype=torch.float64, requires_grad=True) for shape in ((3, 4), (4, 5), (5,))]
    registration = torch.library.opcheck(bias_op.default, tuple(inputs), raise_exception=False,
                                         test_utils=("test_autograd_registration",))["test_autograd_registration"]
    require(registration == "SUCCESS", NO_BACKWARD.format(name=name, file=operator.python_name))
    # A square output for the Jacobians, so that a gradient wrong in any other way
    # than those bias_gradient_problem names shows up as wrong entries rather than a
    # shape error.
    m, k, n = 4, 3, 4
    inputs = (fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64), fresh(n, dtype=torch.float64))
    try:
        problem = bias_gradient_problem(operator, bias_op)
        problems = [problem] if problem else jacobian_mismatches(bias_op, inputs, ["a", "b", "bias"])
    except Exception as error:
        raise raised(operator, "the backward (or its setup_context)", error,
                     SAVED_TENSORS_HINT.format(file=operator.python_name)) from None
    require(not problems, "\n".join(problems))
    return "registered; grad_bias is grad.sum(0) in float64; gradcheck-style Jacobians agree for a, b and bias"


def bias_gradient_problem(operator, bias_op):
    """grad_bias for one fresh grad at 6x3x4 (M != N), against grad.sum(0) in float64:
    None where it agrees to float64's rounding, else the cause by name, the shape seen,
    and the backward's file and line."""
    m, k, n = 6, 3, 4
    a, b = fresh(m, k, dtype=torch.float64), fresh(k, n, dtype=torch.float64)
    bias, grad = fresh(n, dtype=torch.float64, requires_grad=True), fresh(m, n, dtype=torch.float64)
    try:
        out, found = bias_op(a, b, bias), {}
    except Exception:  # a forward that cannot run at M != N: the forward row names it
        return None

    def backward():
        found["grad_bias"], = torch.autograd.grad(out, bias, grad, allow_unused=True)

    code, error = first_call_in_folder(operator, backward)
    if error is not None:
        # Autograd refuses a gradient of another shape than the bias's before it is seen.
        shape = re.search(r"invalid gradient at index 2 - got \[([\d, ]*)\]", str(error))
        if not shape:
            raise error
        found["shape"] = [int(size) for size in shape.group(1).split(",") if size.strip()]
    where = (f" Fix: in {os.path.basename(code.co_filename)}:{code.co_firstlineno}, {code.co_name}, "
             if code else f" Fix: in {operator.python_name}'s backward for wmma_mm_bias, ")
    where += "grad_bias = grad.sum(0), in grad's dtype."
    expected = grad.sum(0)
    if "shape" in found:
        seen = found["shape"]
        cause = ("grad summed over the wrong axis: one value per row of grad" if seen == [m]
                 else "not one value per column of grad")
        return (f"grad_bias has shape {seen} for a {m}x{n} output, where the bias has shape [{n}]: {cause}. "
                f"bias[j] is added to every row of column j, so its gradient sums grad down the rows "
                f"(over dim 0)." + where)
    got = found.get("grad_bias")
    if got is None:
        return "the backward returns None for the bias: no grad_bias reaches it." + where
    got = got.detach().double()
    tolerance = 1e-12 * grad.abs().sum(0)  # float64 sums of 6 terms: far under 1e-12 relative
    if ((got - expected).abs() <= tolerance).all():
        return None
    if torch.allclose(got, expected / m, rtol=1e-12, atol=0):
        return f"grad_bias is grad.mean(0), grad.sum(0) divided by M = {m}: a mean where the chain rule sums." + where
    worst = ((got - expected).abs() / expected.abs()).max().item()
    if worst <= 2.0**-10:
        return (f"grad_bias is off grad.sum(0) by up to {worst:.1e} of its value: it was rounded through a "
                f"narrower dtype (FP16 keeps 2^-11 = 4.9e-04). Autograd casts it back to the bias's dtype, and "
                f"in FP16 a column sum past 65504 becomes inf: sum in grad's dtype, with no cast." + where)
    return (f"grad_bias is not grad.sum(0): got {got[:n].tolist()}, expected {expected.tolist()} "
            f"(grad {m}x{n})." + where)


NO_FAKE = ("no fake implementation is registered for {name}: torch.compile cannot trace it and splits "
           "the graph there, the lesson's pitfall 'torch.compile gets slower'. Fix: in {file}'s _register, "
           'torch.library.register_fake("{name}", fake, lib=library)')


def exercise_fake(operator, bias_op):
    name = bias_op._qualified_op_name
    a, b, bias = fresh(3, 4, dtype=torch.float64), fresh(4, 5, dtype=torch.float64), fresh(5, dtype=torch.float64)
    try:
        bias_op(a, b, bias)
    except Exception as error:
        raise Skip(f"the forward raises at 3x4x5 ({type(error).__name__}), so there is no "
                   "real output to compare the fake with: fix the forward first") from None
    # CUDA's dtypes first, on fake CUDA tensors: no GPU needed. On the CPU float64 in
    # is float64 out, so a fake that returns the input's dtype passes opcheck below
    # and plans FP16 here, where the kernel writes FP32.
    m, k, n = 2 * op.TILE_M, 3 * op.TILE_K, 3 * op.TILE_N
    seen = f"fake CUDA tensors ({m}x{k} @ {k}x{n} torch.float16, bias {n} torch.float32)"
    try:
        with FakeTensorMode():
            out = bias_op(torch.empty(m, k, dtype=torch.half, device="cuda"),
                          torch.empty(k, n, dtype=torch.half, device="cuda"), torch.empty(n, device="cuda"))
            shape, dtype = tuple(out.shape), out.dtype
    except UnsupportedOperatorException:
        raise Fail(NO_FAKE.format(name=name, file=operator.python_name)) from None
    except Exception as error:
        raise raised(operator, f"the fake, on {seen},", error) from None
    require(shape == (m, n) and dtype == torch.float32,
            f"on {seen} the fake gives {'x'.join(map(str, shape))} {dtype}, the kernel {m}x{n} torch.float32: "
            f"in {operator.python_name}'s fake the output is M x N and its dtype the accumulate dtype, "
            "accumulate_dtype(a.dtype), not the input's")
    results = torch.library.opcheck(bias_op.default, (a, b, bias),
                                    test_utils=("test_schema", "test_faketensor"), raise_exception=False)
    failed = {test: outcome for test, outcome in results.items() if outcome != "SUCCESS"}
    require(not failed, "cpu f64: " + "; ".join(f"{test}: {str(outcome).splitlines()[0]}"
                                                for test, outcome in failed.items()))
    return "fake CUDA f16 in, f32 out; opcheck test_schema, test_faketensor"


def exercise_cuda_forward(operator, bias_op):
    require_gpu(operator)
    require_implementation(operator, bias_op, "CUDA")
    return ", ".join(forward_on_gpu(bias_op, *shape, bias=True)
                     for shape in ((256, 512, 384), (512, 1024, 128)))


def exercise_cuda_gradient(operator, bias_op):
    """The gradients of a, b and bias through the CUDA kernel against float64: the
    CPU rows differentiate the float64 path, which autograd may trace by itself."""
    require_gpu(operator)
    require_implementation(operator, bias_op, "CUDA")
    m, k, n = 256, 384, 512  # the lesson's first shape
    inputs = [fresh(*shape, dtype=dtype, device="cuda", requires_grad=True)
              for shape, dtype in (((m, k), torch.half), ((k, n), torch.half), ((n,), torch.float32))]
    grad = fresh(m, n, dtype=torch.float32, device="cuda")
    try:
        out = bias_op(*inputs)
    except Exception as error:
        raise raised(operator, f"the CUDA forward at {m}x{k}x{n}", error) from None
    try:
        out.backward(grad)
    except Exception as error:
        raise raised(operator, "the CUDA backward", error,
                     SAVED_TENSORS_HINT.format(file=operator.python_name)) from None
    wide = [t.detach().double().cpu().requires_grad_() for t in inputs]
    torch.addmm(wide[2], wide[0], wide[1]).backward(grad.double().cpu())
    # As in check 7: FP16 inputs and gradients (2^-11 each) and FP32 sums, about
    # 1e-3 in norm. A missing or wrong formula is off by order 1.
    for name, got, expected in zip(("a", "b", "bias"), inputs, wide):
        require(got.grad is not None, f"grad of {name} is None after backward on CUDA: "
                                      + NO_BACKWARD.format(name=bias_op._qualified_op_name,
                                                           file=operator.python_name).split(": ", 1)[0])
        error = (got.grad.double().cpu() - expected.grad).norm() / expected.grad.norm()
        require(error <= 1e-2, f"grad of {name} on CUDA is off by {error:.2e} in norm (bound 1e-2)")
    # Column sums past FP16's largest value, 65504: 8192 rows of gradients near 10.
    # An FP32 sum of 8192 terms is within 8192 * 2^-24 = 5e-4 of float64, relatively;
    # a sum through FP16 is inf.
    m, k, n = 8192, op.TILE_K, op.TILE_N
    a = fresh(m, k, dtype=torch.half, device="cuda")
    b = fresh(k, n, dtype=torch.half, device="cuda")
    bias = fresh(n, dtype=torch.float32, device="cuda", requires_grad=True)
    grad = 10 + 0.1 * fresh(m, n, dtype=torch.float32, device="cuda")
    try:
        out = bias_op(a, b, bias)
    except Exception as error:
        raise raised(operator, f"the CUDA forward at {m}x{k}x{n}", error) from None
    try:
        (got,) = torch.autograd.grad(out, bias, grad)
    except Exception as error:
        raise raised(operator, f"the CUDA backward at {m}x{k}x{n}", error) from None
    expected = grad.double().sum(0)
    largest = (got.double() - expected).abs().max().item() / expected.abs().min().item()
    require(torch.isfinite(got).all() and largest <= 8192 * 2.0**-24,
            f"with column sums near {expected.mean().item():.0f} (FP16 stops at 65504), grad_bias on CUDA "
            + ("has inf or NaN" if not torch.isfinite(got).all() else f"is off by {largest:.1e} relatively")
            + f": it passed through a narrower dtype. Fix: in {operator.python_name}'s backward for "
            f"{bias_op._qualified_op_name}, grad_bias = grad.sum(0), in grad's dtype (FP32), with no cast")
    return f"grads of a, b and bias match float64; grad_bias finite and right at sums near {expected.mean().item():.0f}"


def no_exercise_yet():
    raise Skip("no such operator registered yet")


def exercise_rows(operator=LESSON):
    """Check 6's rows for operator.bias_op: its namespace's wmma_mm_bias unless the
    Operator names another (checks/self_test.py hands it deliberately wrong ones)."""
    bias_op = operator.bias_op
    if bias_op is None:
        return [("6 exercise: wmma_mm_bias", f"torch.ops.{operator.namespace}.wmma_mm_bias", no_exercise_yet)]
    return [(name, compares, lambda check=check: check(operator, bias_op)) for name, compares, check in (
        ("6 exercise: forward", "a @ b + bias (added to every row), cpu f64", exercise_forward),
        ("6 exercise: contract", "the bias's rules in order: cpu, fake cuda", exercise_contract),
        ("6 exercise: wrapper", "the Python wrapper; schema (a, b, bias)", exercise_wrapper),
        ("6 exercise: gradient", "registered; grad_bias vs sum(0); Jacobians", exercise_gradient),
        ("6 exercise: fake", "fake's shape, dtype: cpu f64, fake cuda f16", exercise_fake),
        ("6 exercise: cuda forward", "both lesson shapes, f16 in, f32 out vs float64", exercise_cuda_forward),
        ("6 exercise: cuda gradient", "grads of a, b, bias through the kernel vs f64", exercise_cuda_gradient),
    )]


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
    error_ratio's bound for an FP16-rounded, power-of-two-scaled grad (the lesson's
    FP32 matmuls are well inside it; a backward on tensor cores that scales grad into
    FP16 must be too), and no worse than the fp16 autocast path (grad cast to FP16 as
    it is). Small gradients first: a backward that keeps the scale of an earlier call
    overflows on the randn ones. Failure modes of a backward that scales grad into FP16
    (checks/self_test.py plants each): grad cast to FP16 unscaled loses values under 6e-5;
    a scale derived from the signed maximum overflows on gradients that are all
    negative; a largest-magnitude pass that misses the first element, or the last
    block's rows, overflows where the largest value sits there. And a grad with padded
    rows, as torch.cat([c1, c2], dim=1) hands c1 (row stride N + 8): a backward that
    reads it as one dense run takes the padding for values."""
    mm = operator.wrapper
    require_gpu(operator)
    m, k, n = 256, 384, 512
    report = []
    for regime in ("1e-7..1e-5", "randn", "all positive", "all negative", "largest first", "largest last",
                   "padded rows"):
        a = fresh(m, k, dtype=torch.half, device="cuda", requires_grad=True)
        b = fresh(k, n, dtype=torch.half, device="cuda", requires_grad=True)
        grad = torch.randn(m, n, device="cuda")
        if regime == "padded rows":
            grad = torch.randn(m, n + 8, device="cuda")[:, :n]
        elif regime == "1e-7..1e-5":
            grad = grad.sign() * 10 ** torch.empty_like(grad).uniform_(-7, -5)
        elif regime.startswith("all"):
            grad = grad.abs() * (1 if regime == "all positive" else -1)
        elif regime.startswith("largest"):  # 64 times the rest, in the first or the last element
            grad.view(-1)[0 if regime == "largest first" else -1] = 64 * grad.abs().max()
        mm(a, b).backward(grad)
        worst = max(error_ratio(a.grad, grad, b.t(), rounded_left=True),
                    error_ratio(b.grad.t(), grad.t(), a, rounded_left=True))
        require(worst <= 1.0, f"{regime}: {100 * worst:.3g}% of the bound")
        reference = grad.double() @ b.double().t()
        error, fp16_error = ((g.double() - reference).norm() / reference.norm() for g in (a.grad, grad.half() @ b.t()))
        require(error <= 1.02 * fp16_error, f"{regime}: relative error {error:.2e}, fp16 path {fp16_error:.2e}")
        report.append(f"{regime}: {100 * worst:.1f}%" + (f" of bound, {error:.1e} (fp16 path {fp16_error:.1e})"
                                                          if len(report) < 2 else ""))
    return "; ".join(report)


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
    weights = [fresh(*shape, dtype=torch.float32, device="cuda") for shape in ((m, n), (m, k), (k, n))]

    def penalty(a, b, matmul, weights):  # a function of the first gradients
        out, weight_a, weight_b = weights
        grad_a, grad_b = torch.autograd.grad((torch.tanh(matmul(a, b)) * out).sum(), (a, b), create_graph=True)
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
        worst = max(worst, error_ratio(c, a, b), error_ratio(a.grad, grad, b.t(), rounded_left=True),
                    error_ratio(b.grad.t(), grad.t(), a, rounded_left=True))
        require(worst <= 1.0, f"replay with gradients of {magnitude:g}: {100 * worst:.3g}% of bound")
    return f"3 replays, gradients 1e-6 to 30, worst {100 * worst:.1f}% of bound"


# ---------------------------------------------------------------------------
# The table, top to bottom
# ---------------------------------------------------------------------------
def lesson_rows(operator=LESSON):
    """The table's rows, 1 to 15, each checking `operator`."""
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
        row("13 backward accuracy", "grads: tiny, randn, one sign, big at ends, padded",
            check_backward_accuracy),
        row("14 double backward, cpu f64", "gradgradcheck: second derivatives", check_double_backward, "cpu"),
        row("14 double backward, cuda f16", "grad of a function of the grads vs float64",
            check_double_backward, "cuda"),
        # Last: a capture that fails leaves the CUDA generator in capture state,
        # and every later torch.randn on the GPU in this process would raise.
        row("15 CUDA graph", "fwd+bwd captured once, replayed on new values", check_cuda_graph),
    ]


def print_provenance(operator=LESSON):
    built, cuda_home = operator.build, operator.build["cuda_home"]
    nvcc = op.nvcc_version_text(cuda_home).replace("\n", "\n    ") if cuda_home else "not found"
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
