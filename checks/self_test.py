"""self_test.py: every check of test_op.py against a deliberately wrong operator.

    python checks/self_test.py

A check that cannot fail proves nothing. Each row here hands one of test_op.py's
checks an operator that breaks one promise (a silent copy, a missing fake, a
missing backward, the default stream, a host sync, ...) and passes only when the
check fails; row 14 gets a gate.cu that compiles and fails only when it runs (on a
GPU; without one that case skips its run). Then the exercise grader (check 6) grades
each registration of wmma_mm_bias in EXERCISE_CASES, each in a fresh process and a
namespace of its own (day87_exercise_case, so that a folder whose exercise is solved
keeps its own day87::wmma_mm_bias), and each verdict must be the expected one; where
the folder has its own wmma_mm_bias, the grader grades that too, and it must pass.
"""

import concurrent.futures
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile
import warnings

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import torch  # noqa: E402

import hardening  # noqa: E402
import op  # noqa: E402
import test_op  # noqa: E402
from test_op import Fail, Skip, require  # noqa: E402


def wrong_variants():
    """Operators that return the right numbers (or nearly) and break one promise each."""
    library = torch.library.Library("day87_wrong", "DEF")
    library.define("no_fake(Tensor a, Tensor b) -> Tensor")
    library.define("no_autograd(Tensor a, Tensor b) -> Tensor")
    library.define("swapped_saves(Tensor a, Tensor b) -> Tensor")
    library.define("bare_fake(Tensor a, Tensor b) -> Tensor")
    library.define("synchronizing_backward(Tensor a, Tensor b) -> Tensor")
    library.define("undifferentiable_backward(Tensor a, Tensor b) -> Tensor")
    library.define("reads_rows_as_dense(Tensor a, Tensor b) -> Tensor")
    def opaque_kernel(a, b):
        # Like a C++ kernel, invisible to autograd: without no_grad, autograd
        # would record the inner wmma_mm call and differentiate through it.
        with torch.no_grad():
            return torch.ops.day87.wmma_mm(a, b)

    for name in ("no_fake", "no_autograd", "swapped_saves", "bare_fake", "synchronizing_backward",
                 "undifferentiable_backward", "reads_rows_as_dense"):
        for device in ("CPU", "CUDA"):  # per-device kernels, as binding.cpp registers
            library.impl(name, opaque_kernel, device)
    # Band 1 of the lesson's diagram plus autograd: eager and backward work, the compiler
    # cannot trace.
    torch.library.register_autograd("day87_wrong::no_fake", op._backward,
                                    setup_context=op._setup_context, lib=library)
    # Band 2: the compiler can trace it, backward finds no formula.
    torch.library.register_fake("day87_wrong::no_autograd", op._fake, lib=library)

    def saves_b_then_a(ctx, inputs, output):  # while op._backward unpacks a, b
        a, b = inputs
        ctx.save_for_backward(b if ctx.needs_input_grad[0] else None,
                              a if ctx.needs_input_grad[1] else None)

    torch.library.register_fake("day87_wrong::swapped_saves", op._fake, lib=library)
    torch.library.register_autograd("day87_wrong::swapped_saves", op._backward,
                                    setup_context=saves_b_then_a, lib=library)

    def bare_fake(a, b):  # the lesson's fake as printed: its checks carry no message
        torch._check(a.dim() == 2 and b.dim() == 2)
        torch._check(a.shape[1] == b.shape[0])
        torch._check(a.dtype == b.dtype)
        torch._check(a.device == b.device)
        return a.new_empty((a.shape[0], b.shape[1]), dtype=op.accumulate_dtype(a.dtype))

    torch.library.register_fake("day87_wrong::bare_fake", bare_fake, lib=library)

    def reads_rows_as_dense_backward(ctx, grad):  # grad's memory taken as M x N floats in a row
        return op._backward(ctx, grad.as_strided(grad.shape, (grad.shape[1], 1)))

    def synchronizing_backward(ctx, grad):  # "to see errors where they happen", then the matmuls
        torch.cuda.synchronize()
        return op._backward(ctx, grad)

    def undifferentiable_backward(ctx, grad):  # right first derivatives, no graph behind them
        with torch.no_grad():
            return op._backward(ctx, grad)

    for name, backward in (("synchronizing_backward", synchronizing_backward),
                           ("undifferentiable_backward", undifferentiable_backward),
                           ("reads_rows_as_dense", reads_rows_as_dense_backward)):
        torch.library.register_fake(f"day87_wrong::{name}", op._fake, lib=library)
        torch.library.register_autograd(f"day87_wrong::{name}", backward,
                                        setup_context=op._setup_context, lib=library)

    def copies_silently(a, b):  # what a library operator does: a hidden .contiguous()
        return op.wmma_mm(*(t.contiguous() if torch.is_tensor(t) else t for t in (a, b)))

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

    def synchronizing_forward(a, b):  # a device-wide barrier after the launch
        c = torch.ops.day87.wmma_mm(a, b)
        torch.cuda.synchronize()
        return c

    # waits for the GPU, then launches: the stream stays busy
    def synchronizing_before_launch(a, b):
        torch.cuda.synchronize()
        return torch.ops.day87.wmma_mm(a, b)

    def plain_matmul(a, b):  # right numbers, but not the registered operator
        return torch.mm(a.float(), b.float()) if a.is_cuda else torch.mm(a, b)

    return library, {
        "copies non-contiguous inputs": copies_silently,
        "drops the last K step": drops_last_k_step,
        "no fake registered": torch.ops.day87_wrong.no_fake,
        "no backward registered": torch.ops.day87_wrong.no_autograd,
        "saves b, a; unpacks a, b": torch.ops.day87_wrong.swapped_saves,
        "fake with bare torch._check": torch.ops.day87_wrong.bare_fake,
        "backward reads padded rows as dense": torch.ops.day87_wrong.reads_rows_as_dense,
        "launches on the default stream": on_default_stream,
        "reads the output back (sync)": checks_for_nan,
        "forward synchronizes after its launch": synchronizing_forward,
        "forward synchronizes before its launch": synchronizing_before_launch,
        "backward synchronizes before its matmuls": torch.ops.day87_wrong.synchronizing_backward,
        "backward under torch.no_grad()": torch.ops.day87_wrong.undifferentiable_backward,
        "plain torch.mm": plain_matmul,
    }


def must_fail_rows(cases, variants, library, operator):
    """A table row per (row, its check given an Operator, the wrong variant it must fail
    on): the row passes only when the check fails on `operator` called through the variant."""
    rows = []
    for row, check, variant in cases:
        # `library` rides along in each closure: the wrong operators live only as
        # long as the Library object that registered them.
        def caught(check=check, variant=variant, library=library):
            try:
                with warnings.catch_warnings():  # the variants' own deprecation warnings
                    warnings.simplefilter("ignore")
                    check(operator.with_wrapper(variants[variant]))
            except Skip:
                raise
            except Exception as error:  # Fail, or the variant's own error: caught either way
                return f"caught: {str(error).splitlines()[0][:110]}"
            raise Fail(f"the row passed against the wrong variant '{variant}'")

        rows.append((row, f"must fail: {variant}", caught))
    return rows


def prove_rows():
    library, variants = wrong_variants()
    # (row, its check given an Operator, the wrong variant it must fail on)
    cases = [
        ("1 contract, cpu", lambda wrong: test_op.check_contract(wrong, "cpu"),
         "copies non-contiguous inputs"),
        ("1 contract, cuda", lambda wrong: test_op.check_contract(wrong, "cuda"),
         "copies non-contiguous inputs"),
        ("2 forward 256x512x384", lambda wrong: test_op.check_forward(wrong, 256, 512, 384),
         "drops the last K step"),
        ("7 autograd, cpu f64", lambda wrong: test_op.check_autograd(wrong, "cpu"),
         "no backward registered"),
        ("7 autograd, cuda f16", lambda wrong: test_op.check_autograd(wrong, "cuda"),
         "no backward registered"),
        ("7 autograd, cpu f64", lambda wrong: test_op.check_autograd(wrong, "cpu"),
         "saves b, a; unpacks a, b"),
        ("7 autograd, cuda f16", lambda wrong: test_op.check_autograd(wrong, "cuda"),
         "saves b, a; unpacks a, b"),
        ("8 torch.compile, cpu f64", lambda wrong: test_op.check_compile(wrong, "cpu"),
         "no fake registered"),
        ("8 torch.compile, cuda f16", lambda wrong: test_op.check_compile(wrong, "cuda"),
         "no fake registered"),
        ("8 torch.compile, cpu f64", lambda wrong: test_op.check_compile(wrong, "cpu"),
         "fake with bare torch._check"),
        ("8 torch.compile, cuda f16", lambda wrong: test_op.check_compile(wrong, "cuda"),
         "fake with bare torch._check"),
        ("9 stream order", test_op.check_stream_order, "launches on the default stream"),
        ("10 profiler", test_op.check_profiler, "plain torch.mm"),
        ("11 no host sync", test_op.check_no_host_sync, "reads the output back (sync)"),
        ("11 no host sync", test_op.check_no_host_sync, "forward synchronizes after its launch"),
        ("11 no host sync", test_op.check_no_host_sync, "forward synchronizes before its launch"),
        ("11 no host sync", test_op.check_no_host_sync, "backward synchronizes before its matmuls"),
        ("13 backward accuracy", test_op.check_backward_accuracy,
         "backward reads padded rows as dense"),
        ("15 double backward, cpu f64", lambda wrong: hardening.check_double_backward(wrong, "cpu"),
         "backward under torch.no_grad()"),
        ("15 double backward, cuda f16",
         lambda wrong: hardening.check_double_backward(wrong, "cuda"),
         "backward under torch.no_grad()"),
        # Last: a capture that fails midway leaves the CUDA generator in capture
        # state, and every later torch.randn on the GPU in this process raises.
        ("16 CUDA graph", hardening.check_cuda_graph, "reads the output back (sync)"),
    ]
    rows = must_fail_rows(cases, variants, library, test_op.LESSON)
    def fuzz_catches(variant="copies non-contiguous inputs", calls=300):
        from fuzz import fuzz_one
        devices = ["cpu"] if test_op.why_no_kernel() else ["cpu", "cuda"]
        failures = [problem for index in range(calls)
                    for status, problem in [fuzz_one(87, index, devices, variants[variant])]
                    if problem]
        require(failures, f"{calls} fuzz calls found nothing wrong with '{variant}'")
        return f"caught: {len(failures)} of {calls} calls, e.g. {failures[0][:80]}"

    rows.insert(-1, ("fuzz, 300 calls", "must fail: copies non-contiguous inputs", fuzz_catches))
    rows.insert(-1, ("14 gate.cu", f"must fail: {WRONG_GATE}", wrong_gate_caught))
    # The gradcheck row's proof is the table's own 'gradcheck rejects' row.
    rows.append(("4 gradcheck", "must fail: grad_a scaled by 1.01",
                 lambda: test_op.check_gradcheck_rejects(test_op.LESSON)))
    return rows


# A gate.cu a student might write: it compiles and links, and only running it shows it wrong.
WRONG_GATE = "gate.cu passes n, m for m, n"


def wrong_gate_caught():
    """Row 14 on a copy of the folder's CUDA files whose gate.cu calls launchWmmaGemm with
    m and n swapped: the launcher takes both as size_t, so nothing stops it compiling. On
    a GPU the row must fail; without one it builds the gate and cannot run it."""
    lesson = os.path.dirname(test_op.LESSON.gate_source)
    with tempfile.TemporaryDirectory(prefix="day87-wrong-gate-") as folder:
        for path in pathlib.Path(lesson).glob("*.cu*"):  # gate.cu and what it includes
            shutil.copy2(path, folder)
        gate = os.path.join(folder, "gate.cu")
        with open(gate) as source:
            # The lesson's call and the answer key's (with its bias) alike: m, n, k are last
            # but the stream, in the call of checkShape
            text, swaps = re.subn(r"(launchWmmaGemm\(device_a,[^;]*?)\bm, n, k\b", r"\1n, m, k",
                                  source.read())
        require(swaps == 1, f"gate.cu has {swaps} calls of launchWmmaGemm(device_a, ..., m, n, k"
                ", ...): this case swaps the one in checkShape; update its pattern")
        with open(gate, "w") as source:
            source.write(text)
        try:
            detail = test_op.check_gate(test_op.LESSON.with_gate(gate))
        except Fail as failure:  # caught only by its run: a student's would build
            said = str(failure).splitlines()[0]
            require(said.startswith(("the gate ran and failed", "the gate did not finish")),
                    f"the wrong gate.cu must build and fail when run; the row said: {said}")
            return f"caught: {said[:110]}"
    if not torch.cuda.is_available():
        raise Skip("the wrong gate.cu compiles and links, as a student's would; only a run "
                   "shows it wrong, and no GPU is visible")
    raise Fail(f"the row passed against the wrong gate.cu '{WRONG_GATE}': {detail}")


# Registrations of day87::wmma_mm_bias for the exercise grader's self-test:
# (forward, grad_bias, fake, expected failing questions). A grad_bias or fake
# of None leaves that piece unregistered. grad_bias takes (grad, device type).
# Forwards and fakes check the bias's contract (_with_contract) unless a case
# is about a contract left out.
CASE_NAMESPACE = "day87_exercise_case"


def _mm(a, b):
    return torch.ops.day87.wmma_mm(a, b)


def _check_bias(a, b, bias, dtype_blames="bias"):
    """The README's bias rules, the device first (but for a case whose dtype rule
    blames other inputs than the bias)."""
    name = f"{CASE_NAMESPACE}::wmma_mm_bias"
    torch._check(bias.device == a.device, lambda: f"{name}: bias must be on a's device")
    op.check_matrices(name, a, b)
    torch._check(bias.dim() == 1 and bias.shape[0] == b.shape[1],
                 lambda: f"{name}: bias must be 1-D with one value per column of b")
    torch._check(bias.dtype == op.accumulate_dtype(a.dtype),
                 lambda: f"{name}: {dtype_blames} must be {op.accumulate_dtype(a.dtype)}")


def _with_contract(function, contiguity=True, dtype_blames="bias"):
    def checked(a, b, bias):
        _check_bias(a, b, bias, dtype_blames)
        if contiguity:  # eager only: a fake tensor's strides are not eager's
            torch._check(bias.is_contiguous(),
                         lambda: f"{CASE_NAMESPACE}::wmma_mm_bias: bias must be contiguous")
        return function(a, b, bias)
    return checked


def _unchecked_fake(a, b, bias):
    return a.new_empty((a.shape[0], b.shape[1]), dtype=op.accumulate_dtype(a.dtype))


def _reads_the_strided_bias(a, b, bias):
    # The rules asked of a contiguous copy, while the kernel reads the original's
    # memory as if it were dense (what a C++ implementation that checks
    # bias.contiguous() and passes bias.data_ptr() does).
    dense = bias.as_strided(bias.shape, (1,)) if bias.is_cuda and bias.dim() == 1 else bias
    return _with_contract(lambda a, b, _: _mm(a, b) + dense)(a, b, bias.contiguous())


_correct_fake = _with_contract(_unchecked_fake, contiguity=False)


def _fake_without_the_1d_rule(a, b, bias):
    # The bias's rules as the implementation has them, but for its shape, where only the
    # last size is checked: a 1 x N bias passes the fake and is refused in eager.
    name = f"{CASE_NAMESPACE}::wmma_mm_bias"
    torch._check(bias.device == a.device, lambda: f"{name}: bias must be on a's device")
    op.check_matrices(name, a, b)
    torch._check(bias.shape[-1] == b.shape[1], lambda: f"{name}: bias needs one value per column")
    torch._check(bias.dtype == op.accumulate_dtype(a.dtype), lambda: f"{name}: bias dtype")
    return _unchecked_fake(a, b, bias)
_correct_forward = _with_contract(lambda a, b, bias: _mm(a, b) + bias)


def _fake_computing_the_dtype_first(a, b, bias):
    # The accumulate dtype before a and b's rules: a float32 a gets accumulate_dtype's
    # TypeError, where the implementation names rule 'dtype'.
    op.accumulate_dtype(a.dtype)
    return _correct_fake(a, b, bias)


def _device_checked_after_a_and_b(a, b, bias):
    # As a CUDA implementation that checks a and b against its own dtype (float16,
    # wherever they are) before it checks the bias's device.
    if bias.is_cuda:
        torch._check(a.dtype == b.dtype == torch.half,
                     lambda: f"{CASE_NAMESPACE}::wmma_mm_bias: a and b must be torch.float16")
    return _correct_forward(a, b, bias)


def _sum(grad, device):
    return grad.sum(0)


EXERCISE_CASES = {
    "correct reference": (_correct_forward, _sum, _correct_fake, set()),
    # Wrong in matching ways: the backward agrees with the wrong forward, so only
    # the forward questions can catch it (the lesson's last pitfall).
    "bias broadcast along rows": (_with_contract(lambda a, b, bias: _mm(a, b) + bias.unsqueeze(1)),
                                  lambda grad, device: grad.sum(1), _correct_fake,
                                  {"forward", "cuda forward", "cuda gradient"}),
    "bias added twice": (_with_contract(lambda a, b, bias: _mm(a, b) + 2 * bias), _sum,
                         _correct_fake, {"forward", "gradient", "cuda forward"}),
    "grad_bias over the wrong axis": (_correct_forward, lambda grad, device: grad.sum(1),
                                      _correct_fake, {"gradient", "cuda gradient"}),
    # Autograd sums a gradient of the output's shape down to the bias's: only the
    # backward's own return value shows it.
    "grad_bias is grad itself": (_correct_forward, lambda grad, device: grad, _correct_fake,
                                 {"gradient"}),
    "grad_bias scaled (mean)": (_correct_forward, lambda grad, device: grad.mean(0), _correct_fake,
                                {"gradient", "cuda gradient"}),
    # Right on the CPU, wrong on CUDA: only the CUDA gradient row sees it.
    "grad_bias wrong axis, CUDA only": (
        _correct_forward, lambda grad, device: grad.sum(1) if device == "cuda" else grad.sum(0),
        _correct_fake, {"cuda gradient"}),
    "fake with the wrong shape": (_correct_forward, _sum, _with_contract(
        lambda a, b, bias: a.new_empty(a.shape, dtype=op.accumulate_dtype(a.dtype)),
        contiguity=False), {"fake"}),
    "fake with the wrong dtype": (_correct_forward, _sum, _with_contract(
        lambda a, b, bias: a.new_empty((a.shape[0], b.shape[1]), dtype=torch.float32),
        contiguity=False), {"fake"}),
    # float64 in gives float64 out on the CPU, so only fake CUDA tensors show it.
    "fake with the input's dtype": (_correct_forward, _sum, _with_contract(
        lambda a, b, bias: a.new_empty((a.shape[0], b.shape[1]), dtype=a.dtype),
        contiguity=False), {"fake"}),
    # The contract's row asks the fake too, and says the same.
    "no fake registered": (_correct_forward, _sum, None, {"contract", "fake"}),
    # On the CPU autograd records the kernel's own ops (as it records the answer
    # key's at::addmm), so the Jacobians agree; only the registration says it.
    "no backward registered": (_correct_forward, None, _correct_fake,
                               {"gradient", "cuda gradient"}),
    "backward returns None for bias": (_correct_forward, lambda grad, device: None, _correct_fake,
                                       {"gradient", "cuda gradient"}),
    # Rounded once, autograd casts it back: the CPU sees the rounding (float64 against
    # float64), a GPU the entries past FP16's largest value.
    "grad_bias rounded through FP16": (_correct_forward, lambda grad, device: grad.sum(0).half(),
                                       _correct_fake, {"gradient", "cuda gradient"}),
    "no contract for the bias": (lambda a, b, bias: _mm(a, b) + bias, _sum, _correct_fake,
                                 {"contract"}),
    # The message blames a and b: it does not name the bias.
    "bias dtype rule blames a and b": (
        _with_contract(lambda a, b, bias: _mm(a, b) + bias, dtype_blames="a and b"), _sum,
        _correct_fake, {"contract"}),
    "a fake without the bias's checks": (_correct_forward, _sum, _unchecked_fake, {"contract"}),
    # The fake's refusal of a float32 a must be the implementation's, word for word.
    "fake computing the dtype first": (_correct_forward, _sum, _fake_computing_the_dtype_first,
                                       {"contract"}),
    # The fake's verdict must be the implementation's: it accepts a bias that is not 1-D.
    "a fake without the bias's 1-D rule": (_correct_forward, _sum, _fake_without_the_1d_rule,
                                           {"contract"}),
    "a wrapper that drops the bias": (_correct_forward, _sum, _correct_fake, {"wrapper"}),
    # Wrong on CUDA alone, where the refusals are asked of the CUDA implementation. A
    # CUDA bias beside CPU float64 a and b reaches it, and a and b's rules blame them.
    "bias's device after a and b's (CUDA)": (_device_checked_after_a_and_b, _sum, _correct_fake,
                                             {"contract"}),
    "a copy checked, the strided bias read": (_reads_the_strided_bias, _sum, _correct_fake,
                                                          {"contract"}),
}

# The Python wrapper a case's folder would define beside wmma_mm: the operator itself,
# unless the case is about the wrapper.
CASE_WRAPPERS = {"a wrapper that drops the bias": lambda a, b, bias: _mm(a, b)}

# Questions a case fails only where the CUDA implementation runs.
ON_CUDA_ONLY = {"bias's device after a and b's (CUDA)": {"contract"},
                "a copy checked, the strided bias read": {"contract"}}

# What a failing row must say for a case: what it saw, and the hint that applies.
# None of them states the gradient's formula.
CAUSES = {("a fake without the bias's 1-D rule", "contract"): [
              "a 1 x 128 bias (fake cpu): the call returned instead of raising",
              "where the CPU implementation raised"],
          ("fake computing the dtype first", "contract"): [
              "a in float32 (fake cpu): the fake raised 'day87: no accumulate dtype",
              "where the CPU implementation raised", "rule 'dtype'",
              "self_test.py's fake checks binding.cpp's rules in binding.cpp's order"],
          ("grad_bias over the wrong axis", "gradient"): [
              "has shape [6] for a bias of shape [4]", "Hint 1"],
          ("grad_bias is grad itself", "gradient"): [
              "has shape [6, 4] for a bias of shape [4]", "Hint 1"],
          ("grad_bias scaled (mean)", "gradient"): ["grad_bias[0]: got", "expected", "Hint 2"],
          ("backward returns None for bias", "gradient"): ["grad_bias is None", "Hint 2"],
          ("grad_bias rounded through FP16", "gradient"): ["FP16's precision"],
          ("grad_bias rounded through FP16", "cuda gradient"): ["passed through FP16"],
          ("no backward registered", "gradient"): ["no backward is registered"],
          ("bias added twice", "forward"): ["a @ b + 2 * bias: the bias is added 2 times"],
          ("bias added twice", "gradient"): ["d out[", "/d bias["],
          ("bias added twice", "cuda forward"): ["a @ b + 2 * bias"],
          ("bias's device after a and b's (CUDA)", "contract"): [
              "a CUDA bias beside CPU a and b in float64 (cuda, in a child process): "
              "raised, but not naming the bias"],
          ("a copy checked, the strided bias read", "contract"): [
              "a strided bias (every second value) (cuda): the call returned a wrong answer"]}


def register_exercise_case(name):
    forward, grad_bias, fake, _ = EXERCISE_CASES[name]

    def cuda_kernel(a, b, bias):
        # Opaque to autograd, as a kernel launch is: the backward must come from
        # the registration, not from autograd tracing these ops.
        with torch.no_grad():
            return forward(a, b, bias)

    library = torch.library.Library(CASE_NAMESPACE, "DEF")
    library.define("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor")
    # The CPU kernel is seen through by autograd, as binding.cpp's at::addmm is.
    library.impl("wmma_mm_bias", forward, "CPU")
    library.impl("wmma_mm_bias", cuda_kernel, "CUDA")
    if fake is not None:
        torch.library.register_fake(f"{CASE_NAMESPACE}::wmma_mm_bias", fake, lib=library)
    if grad_bias is not None:
        def setup_context(ctx, inputs, output):
            a, b, _ = inputs
            ctx.save_for_backward(a, b)

        def backward(ctx, grad):
            a, b = ctx.saved_tensors
            grad_a = torch.matmul(grad, b.t().to(grad.dtype)).to(a.dtype)
            grad_b = torch.matmul(a.t().to(grad.dtype), grad).to(b.dtype)
            return grad_a, grad_b, grad_bias(grad, grad.device.type)

        torch.library.register_autograd(f"{CASE_NAMESPACE}::wmma_mm_bias", backward,
                                        setup_context=setup_context, lib=library)
    return library


# A process run with DAY87_EXERCISE_CASE set registers that case at import: the
# grader's child processes (its calls that can fault) import this file to get it.
CASE = os.environ.get("DAY87_EXERCISE_CASE")
_case_library = register_exercise_case(CASE) if CASE else None


QUESTION_OF_ROW = {"6 exercise: forward": "forward", "6 exercise: contract": "contract",
                   "6 exercise: wrapper": "wrapper", "6 exercise: gradient": "gradient",
                   "6 exercise: fake": "fake", "6 exercise: cuda forward": "cuda forward",
                   "6 exercise: cuda gradient": "cuda gradient"}


def grade_exercise_cases():
    """Run the sixth check once per registration, each in a fresh process (an
    operator cannot be unregistered), print what each run printed, and return
    one row per case comparing its verdict with the expected one."""
    def run(name):
        return subprocess.run([sys.executable, os.path.abspath(__file__)], capture_output=True,
                              text=True, env=dict(os.environ, DAY87_EXERCISE_CASE=name))

    # The cases side by side, a few at a time: each is a process of its own, and most of
    # its time is importing torch and the operator.
    with concurrent.futures.ThreadPoolExecutor(max(1, min(8, (os.cpu_count() or 2) // 2))) as pool:
        runs = dict(zip(EXERCISE_CASES, pool.map(run, EXERCISE_CASES)))
    for name, child in runs.items():
        print(f"--- the sixth check, on the registration '{name}':")
        print(child.stdout)

    def graded(name):
        child, expected = runs[name], EXERCISE_CASES[name][-1]
        rows = {question: line for line in child.stdout.splitlines()
                for row, question in QUESTION_OF_ROW.items()
                if line.startswith(row) and " FAIL, " in line}
        if test_op.why_no_kernel():
            expected = expected - {"cuda forward", "cuda gradient"} - ON_CUDA_ONLY.get(name, set())
        require(child.returncode == (1 if rows else 0),
                f"exit status {child.returncode}; stderr ends: {child.stderr.strip()[-300:]}")
        require(set(rows) == expected,
                f"failed {sorted(rows) or 'nothing'}, expected {sorted(expected) or 'nothing'}")
        # A row's message with its continuation lines, as the student reads it.
        lines = child.stdout.splitlines()
        for question, line in rows.items():
            index = lines.index(line)
            told = "\n".join([line] + [more for more in lines[index + 1:index + 8]
                                       if more.startswith("    ")])
            words = CAUSES.get((name, question), ["d out["] if question == "gradient" else [])
            require(all(word in told for word in words),
                    f"row '{question}' does not say {words}: {told[:300]}")
        return f"failed {', '.join(sorted(rows)) or 'nothing'}, as expected"

    rows = [(f"grader: {name}", "the sixth check's verdict", lambda name=name: graded(name))
            for name in EXERCISE_CASES]
    if hasattr(torch.ops.day87, "wmma_mm_bias"):  # the exercise is solved in this folder
        rows += [(f"this folder's wmma_mm_bias: {row[len('6 exercise: '):]}", compares, check)
                 for row, compares, check in test_op.exercise_rows()]
    return rows


class ExerciseCase(test_op.Operator):
    """Check 6's operator for one case: the case's wmma_mm_bias, in a namespace of its own,
    registered by this file, which the grader's child processes import to get it again."""

    def __init__(self, case):
        super().__init__(CASE_NAMESPACE, op)  # the lesson's wmma_mm and build beside it
        # This module: "__main__" in the case's process, which check 6's spawned children
        # import again (as spawn re-imports a main module), registering the case at import.
        self.module = sys.modules[__name__]
        self.python_file = os.path.abspath(__file__)
        self.bias_wrapper = CASE_WRAPPERS.get(case, self.bias_op)


def main():
    if CASE:  # a child of grade_exercise_cases()
        sys.exit(0 if test_op.run_table(test_op.exercise_rows(ExerciseCase(CASE))) else 1)
    test_op.print_provenance()
    print("Each check, run against a deliberately wrong variant, must fail;")
    print("the exercise grader must give each registration the expected verdict.\n")
    # The exercise's rows first: the last proof leaves a failed CUDA graph capture behind.
    ok = test_op.run_table(grade_exercise_cases() + prove_rows())
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
