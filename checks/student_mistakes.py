"""student_mistakes.py: the exercise's likely mistakes, each laid over the answer key (or
over day87_fast, day 88's solution), must be named.

    python checks/student_mistakes.py              # every mistake this machine can show
    python checks/student_mistakes.py --on-gpu     # on a GPU: those a GPU shows, and those
                                                   # whose CUDA rows answer too (CI runs the rest)
    python checks/student_mistakes.py --list       # the mistakes, what each must be told

Each mistake is one text edit (or a few) of a file of the solved lesson (checks/solved.py
--key: the answer key on a copy). On that copy `python test_op.py` runs as a student
runs it, and the mistake is named when the row it belongs to FAILs with words that
give its cause and where the fix goes (or, for a build that fails, when the import's
error does, its first lines naming the cause, and the next import's again). A mistake in
fast/src/day87_fast/ is laid over a copy of the installed day87_fast (its libraries with
it), and fast/'s table (`python -m tests.test_fast`) must name it the same way; without
day87_fast installed it is skipped. The grader must never give the exercise's answer
away: a run whose output holds any of ANSWER_WORDS does not name its mistake, whatever its
row says. The copies share one build cache:
a mistake in op.py alone reuses the key's build. Every machine here needs nvcc (CI has
it): the builds, kernel.cu's compile error and row 14, "gate.cu", use it. A
mistake that only a GPU shows is skipped without one; --on-gpu runs those and the ones
whose CUDA rows answer too. The exit status is the number of mistakes not named.
"""

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import tempfile

from solved import LESSON, solved_copy

# A mistake in a file under this folder is day87_fast's, laid over its installed package.
FAST_PACKAGE = "fast/src/day87_fast/"

# The kernel's store in the key: the four outputs of one row, the bias added where one is given.
KEY_GUARD = "if (operands.bias)  // bias[j] is added to every row of column j, once"
KEY_STORE_ADD = f'''    {KEY_GUARD}
        value = make_float4(value.x + operands.bias[col], value.y + operands.bias[col + 1],
                            value.z + operands.bias[col + 2], value.w + operands.bias[col + 3]);
'''

# (mistake, file, the key's text, the mistake's text, where it must show, words it must say, where
# it runs). "where" is a row of test_op.py (of fast/'s table for a file under FAST_PACKAGE),
# "any row" (the first row to fail), or "import". A mistake of several edits gives lists of
# texts. A word is a string, or a pattern where only its form is known (a line number). It
# runs on "cpu" (every machine, CI), "gpu" (a GPU shows it), or "both": everywhere, and again
# with --on-gpu, where the CUDA rows answer it too.
MISTAKES = [
    # op.py: the registrations, the fake, the backward, the wrapper.
    ("no backward registered", "op.py",
     '''    torch.library.register_autograd(
        "day87::wmma_mm_bias", _backward_bias, lib=library,
        setup_context=lambda ctx, inputs, output: _setup_context(ctx, inputs[:2], output))
''', "", "6 exercise: gradient",
     ["no backward is registered", "register_autograd", "op.py's _register"], "both"),
    ("no fake registered", "op.py",
     '''    torch.library.register_fake("day87::wmma_mm_bias", _fake_bias, lib=library)
''', "", "6 exercise: fake", ["no fake implementation is registered", "register_fake"], "cpu"),
    # The anchor is the fake's last check: wmma_mm's fake ends with the same return.
    ("the fake returns the input's dtype", "op.py",
     '''bias must be {scalar_type(wide)}; {seen()}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=accumulate_dtype(a.dtype))''',
     '''bias must be {scalar_type(wide)}; {seen()}")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=a.dtype)''',
     "6 exercise: fake",
     ["the fake gives 256x384 torch.float16", "torch.float32 (accumulate_dtype)"], "both"),
    # The accumulate dtype asked for before a and b's rules: for a float32 a the fake raises
    # accumulate_dtype's TypeError, where eager names rule 'dtype'.
    ("the fake computes the accumulate dtype first", "op.py",
     ['''    torch._check(bias.device == a.device,
''', '''    wide = accumulate_dtype(a.dtype)
    torch._check(bias.dtype == wide,'''],
     ['''    wide = accumulate_dtype(a.dtype)
    torch._check(bias.device == a.device,
''', "    torch._check(bias.dtype == wide,"],
     "6 exercise: contract",
     ["a in float32 (fake cpu): the fake raised", "day87: no accumulate dtype",
      "where the CPU implementation raised", "rule 'dtype'",
      "fake checks binding.cpp's rules in binding.cpp's order"], "cpu"),
    ("setup_context saves the bias instead of a and b", "op.py",
     "_setup_context(ctx, inputs[:2], output))", "ctx.save_for_backward(inputs[2]))",
     "6 exercise: gradient", ["not enough values to unpack", "op.py:", "setup_context saves"],
     "cpu"),
    ("setup_context saves b, a", "op.py",
     "_setup_context(ctx, inputs[:2], output))", "ctx.save_for_backward(inputs[1], inputs[0]))",
     "6 exercise: gradient", ["op.py:", "in the same order"], "cpu"),
    ("grad_bias over the wrong axis", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.sum(1) if",
     "6 exercise: gradient", ["grad_bias has shape [6] for a bias of shape [4]", "Hint 1"], "cpu"),
    ("grad_bias a mean", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.mean(0) if",
     "6 exercise: gradient", ["grad_bias[0]: got", "expected", "Hint 2"], "cpu"),
    ("no grad_bias returned", "op.py",
     "grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None", "grad_bias = None",
     "6 exercise: gradient", ["grad_bias is None", "Hint 2"], "cpu"),
    # Autograd casts it back to the bias's dtype: the CPU sees the rounding, a GPU the
    # column sums past FP16's largest value (8192 rows of gradients near 10) as inf.
    ("grad_bias rounded through FP16", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.sum(0).half() if",
     "6 exercise: gradient", ["FP16's precision", "Keep it in grad's dtype"], "both"),
    ("no op.wmma_mm_bias wrapper", "op.py",
     '''def wmma_mm_bias(a, b, bias):
    """a @ b + bias through day87::wmma_mm_bias, the bias added in the kernel's store."""
    check_tensors("day87::wmma_mm_bias", a, b)
    return torch.ops.day87.wmma_mm_bias(a, b, bias)
''', "", "6 exercise: wrapper", ["op.py has no wmma_mm_bias(a, b, bias) beside wmma_mm"], "cpu"),
    ("the fake has none of the bias's checks", "op.py",
     ['''    torch._check(bias.device == a.device,
                 lambda: f"day87::wmma_mm_bias: bias must be on a's device; {seen()}")
''', '''    torch._check(bias.dim() == 1 and bias.shape[0] == b.shape[1], lambda: (
        f"day87::wmma_mm_bias: bias must be 1-D, one value per column of b; {seen()}"))
''', '''    torch._check(bias.dtype == wide,
                 lambda: f"day87::wmma_mm_bias: bias must be {scalar_type(wide)}; {seen()}")
'''], ["", "", ""], "6 exercise: contract",
     ["a CPU bias beside CUDA a and b (fake cuda): the call returned instead of raising",
      "torch._check in the fake"], "cpu"),
    # binding.cpp: the contract, the schema, the registrations, the launcher's declaration.
    ("the bias's contract left out (CPU)", "binding.cpp",
     '''    checkContractWithBias("day87::wmma_mm_bias", a, b, bias, at::kDouble, at::kDouble,
                          /*tile_rules=*/false);''',
     '''    checkContract("day87::wmma_mm_bias", a, b, at::kDouble, /*tile_rules=*/false);''',
     "6 exercise: contract", ["a 1 x 128 bias (cpu): the call returned instead of raising",
                              "(cpu): raised, but not naming the bias"], "cpu"),
    ("the schema names the bias c", "binding.cpp",
     '''m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor");''',
     '''m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor c) -> Tensor");''',
     "6 exercise: wrapper", ["the schema's arguments are (a, b, c), expected (a, b, bias)"], "cpu"),
    ("the impl's name misspelt", "binding.cpp",
     'm.impl("wmma_mm_bias", &wmmaMmBiasCpu);', 'm.impl("wmma_mm_bais", &wmmaMmBiasCpu);',
     "6 exercise: forward",
     ["NotImplementedError", "No CPU implementation", "spelt as in the schema"], "cpu"),
    ("no CPU implementation", "binding.cpp",
     '''    m.impl("wmma_mm_bias", &wmmaMmBiasCpu);
''', "", "6 exercise: forward",
     ["No CPU implementation", "TORCH_LIBRARY_IMPL(day87, CPU, m)"], "cpu"),
    ("the bias broadcast along rows (CPU)", "binding.cpp",
     "return at::addmm(bias, a, b);", "return at::addmm(bias.unsqueeze(1), a, b);",
     "6 exercise: forward", ["3x4x5: the forward raised", "Hint 1"], "cpu"),
    ("launchWmmaGemm changed in kernel.cu only", "binding.cpp",
     # binding.cpp's declaration and call as before the exercise, kernel.cu's definition changed
     ['''cudaError_t launchWmmaGemm(const __half* a, const __half* b, const float* bias, float* c,
                           size_t m, size_t n, size_t k, cudaStream_t stream);''',
      '''        reinterpret_cast<const __half*>(b.const_data_ptr<at::Half>()),
        bias.defined() ? bias.const_data_ptr<float>() : nullptr, c.mutable_data_ptr<float>(),'''],
     ['''cudaError_t launchWmmaGemm(const __half* a, const __half* b, float* c, size_t m, size_t n,
                           size_t k, cudaStream_t stream);''',
      '''        reinterpret_cast<const __half*>(b.const_data_ptr<at::Half>()), '''
      '''c.mutable_data_ptr<float>(),'''],
     "import", ["nothing defines launchWmmaGemm(", "binding.cpp's declaration of launchWmmaGemm",
                "definition in kernel.cu"], "cpu"),
    ("a compile error in kernel.cu", "kernel.cu",
     "value.x + operands.bias[col],", "value.x + operands.bias[column],",
     "import", ["Its first error:", "kernel.cu:", "column"], "cpu"),
    # gate.cu: the launcher's third caller, still calling it without the bias.
    ("gate.cu not updated", "gate.cu",
     ['''    // wmma_mm's case: no bias (nullptr). test_op.py's check 6 runs the bias on the GPU.
    CUDA_CHECK(launchWmmaGemm(device_a, device_b, /*bias=*/nullptr, device_c, m, n, k,
                              /*stream=*/0));''',
      "launchWmmaGemm(nullptr, nullptr, nullptr, nullptr, 100, 128, 16, 0)"],
     ["    CUDA_CHECK(launchWmmaGemm(device_a, device_b, device_c, m, n, k, /*stream=*/0));",
      "launchWmmaGemm(nullptr, nullptr, nullptr, 100, 128, 16, 0)"],
     "gate.cu", ["gate.cu does not compile", re.compile(r"gate\.cu:\d+: ")], "cpu"),
    # gate.cu updated, its arguments in the wrong order: c goes where the bias goes. Both are
    # float pointers, so it compiles; the kernel writes C through the null pointer.
    ("gate.cu passes c where the bias goes", "gate.cu",
     "CUDA_CHECK(launchWmmaGemm(device_a, device_b, /*bias=*/nullptr, device_c, m, n, k,",
     "CUDA_CHECK(launchWmmaGemm(device_a, device_b, device_c, /*bias=*/nullptr, m, n, k,",
     "gate.cu", ["the gate ran and failed", "CUDA error", "in the same order"], "gpu"),
    # A GPU shows these: the CUDA implementation's own checks, and the kernel's store.
    ("the bias added with no null check", "kernel.cu",
     f"    {KEY_GUARD}\n        value =", "    value =",
     "any row", ["illegal memory access", "wmma_mm passes no bias (a null pointer)"], "gpu"),
    ("the bias indexed by row in storeOutputs", "kernel.cu",
     KEY_STORE_ADD, KEY_STORE_ADD.replace("[col]", "[row]").replace("[col + 1]", "[row]")
     .replace("[col + 2]", "[row]").replace("[col + 3]", "[row]"),
     "6 exercise: cuda forward", ["256x512x384", "bias[i] added to row i"], "gpu"),
    # Kept in bounds (modulo N): the row names the columns read, where a read past N would
    # say "not finite" or fault. Not "column 1 got bias[2]": the grader matches each column
    # to the nearest bias value, which FP32 rounding can make a neighbour of bias[2].
    ("the bias read as bias[2 * col]", "kernel.cu",
     KEY_STORE_ADD, KEY_STORE_ADD.replace("[col]", "[(2 * col) % operands.n]")
     .replace("[col + 1]", "[(2 * col + 2) % operands.n]")
     .replace("[col + 2]", "[(2 * col + 4) % operands.n]")
     .replace("[col + 3]", "[(2 * col + 6) % operands.n]"),
     "6 exercise: cuda forward", ["a bias read from other columns", "got bias["], "gpu"),
    ("the bias added twice", "kernel.cu",
     KEY_STORE_ADD, KEY_STORE_ADD.replace(
         KEY_GUARD, "for (int pass = 0; operands.bias && pass < 2; ++pass)"),
     "6 exercise: cuda forward", ["a @ b + 2 * bias: the bias is added 2 times"], "gpu"),
    # As if added inside the main loop: once per step of kBlockK (32) along K.
    ("the bias added at every K step", "kernel.cu",
     KEY_STORE_ADD, KEY_STORE_ADD.replace(
         KEY_GUARD, "for (int step = 0; operands.bias && step < operands.k; step += kBlockK)"),
     "6 exercise: cuda forward", ["added 12 times; K = 384 is 12 steps of 32"], "gpu"),
    ("the bias missing (the kernel ignores it)", "kernel.cu",
     KEY_STORE_ADD, "", "6 exercise: cuda forward", ["a @ b: the bias is missing"], "gpu"),
    ("no CUDA implementation", "binding.cpp",
     '''    m.impl("wmma_mm_bias", &wmmaMmBiasCuda);
''', "", "6 exercise: cuda forward", ["NotImplementedError", "'CUDA' backend"], "gpu"),
    # The dispatcher sends a CUDA bias beside CPU a and b to the CUDA implementation,
    # where a's dtype rule fires first and blames a and b.
    ("the bias's device checked after a and b (CUDA)", "binding.cpp",
     '''    TORCH_CHECK(bias.device() == a.device(), op, ": bias must be on a's device; got bias: ",
                described(bias), ", a: ", described(a), ", b: ", described(b));
    checkContract(op, a, b, input_dtype, tile_rules);
''', '''    checkContract(op, a, b, input_dtype, tile_rules);
    TORCH_CHECK(bias.device() == a.device(), op, ": bias must be on a's device; got bias: ",
                described(bias), ", a: ", described(a), ", b: ", described(b));
''', "6 exercise: contract",
     ["a CUDA bias beside CPU a and b in float64 (cuda, in a child process): "
      "raised, but not naming the bias"], "gpu"),
    # No bias rule at all on CUDA: a CPU bias reaches the kernel, which reads host memory and
    # faults (in check 6's child process, which the table survives).
    ("the bias's contract left out (CUDA)", "binding.cpp",
     "checkContractWithBias(op, a, b, bias, at::kHalf, at::kFloat, /*tile_rules=*/true);",
     "checkContract(op, a, b, at::kHalf, /*tile_rules=*/true);",
     "6 exercise: contract", ["a CPU bias beside CUDA a and b (cuda, in a child process): the call "
                              "returned instead of raising"], "gpu"),
    ("a dense copy checked, the strided bias launched", "binding.cpp",
     "checkContractWithBias(op, a, b, bias, at::kHalf,",
     "checkContractWithBias(op, a, b, bias.contiguous(), at::kHalf,",
     "6 exercise: contract",
     ["a strided bias (every second value) (cuda): the call returned a wrong answer"], "gpu"),
    # day87_fast: its _fake_bias as it once was, the accumulate dtype asked for first.
    ("day87_fast: the fake computes the accumulate dtype first", f"{FAST_PACKAGE}__init__.py",
     ['''    op_name, described = "day87_fast::wmma_mm_bias", lesson_copy.described
''', '''    accumulate = lesson_copy.accumulate_dtype(a.dtype)
    torch._check(bias.dtype == accumulate,'''],
     ['''    op_name, described = "day87_fast::wmma_mm_bias", lesson_copy.described
    accumulate = lesson_copy.accumulate_dtype(a.dtype)
''', "    torch._check(bias.dtype == accumulate,"],
     "6 exercise: contract",
     ["a in float32 (fake cpu): the fake raised", "day87_fast: no accumulate dtype",
      "where the CPU implementation raised", "rule 'dtype'",
      "fake checks fast/csrc/binding.cpp's rules in its order"], "cpu"),
]

# The exercise's answer, or words that spell it: no message of the grader may hold one.
# The lesson's own source is never printed, so a hit is the grader's (or torch's) text.
ANSWER_WORDS = ("sum(", "mean(", "dim=0", "dim 0", "down the rows", "over the rows", "summed over",
                "chain rule")


def answer_given_away(output):
    """The first line of `output` that holds an answer word, or None."""
    return next((line.strip() for line in output.splitlines()
                 if any(word in line.lower() for word in ANSWER_WORDS)), None)


def says(told, word):
    return word.search(told) is not None if isinstance(word, re.Pattern) else word in told


def row_text(output, where):
    """The FAIL line of row `where` (with its continuation lines), or None. A `where`
    without the row's number matches it under any number (rows move as the table grows)."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if ((re.match(rf"(\d+ )?{re.escape(where)}", line) or where == "any row")
                and " FAIL, " in line):
            following = []
            for more in lines[index + 1:]:
                if not more.startswith("    "):
                    break
                following.append(more)
            row = line.split(" FAIL, ", 1)[0].split("  ")[0]
            return "\n".join([f"row '{row}': {line.split(' FAIL, ', 1)[1]}"] + following)
    return None


def fast_package_copy(destination):
    """(a copy of the installed day87_fast in `destination`, where it was copied from), or
    (None, why there is none)."""
    if not os.path.isdir(os.path.join(LESSON, "fast")):
        return None, "no fast/ beside the lesson"
    found = importlib.util.find_spec("day87_fast")  # where it is, without loading its library
    if found is None:
        return None, "day87_fast is not installed (pip install --no-build-isolation ./fast)"
    package = os.path.join(destination, "day87_fast")
    shutil.copytree(os.path.dirname(found.origin), package,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return package, os.path.dirname(found.origin)


def fast_table(package):
    """fast/'s table on the copy `package`, from outside the clone as .ci/run runs it: the
    copy first on the path, then fast/ for its tests. The build cache is the caller's: the
    table builds the unsolved lesson, which it compares against."""
    path = os.pathsep.join([os.path.dirname(package), os.path.join(LESSON, "fast")])
    return subprocess.run([sys.executable, "-m", "tests.test_fast"], cwd=os.path.dirname(package),
                          env=dict(os.environ, PYTHONPATH=path), capture_output=True, text=True,
                          timeout=1200)


def try_mistake(copy, cache, mistake):
    """(named, what the student is told) for one mistake on `copy`: the solved lesson, or
    for a file under FAST_PACKAGE, the copy of day87_fast."""
    name, file, old, new, where, words, _ = mistake
    fast = file.startswith(FAST_PACKAGE)
    path = os.path.join(copy, file[len(FAST_PACKAGE):] if fast else file)
    with open(path) as source:
        text = source.read()
    edited = text
    for before, after in zip(*((old, new) if isinstance(old, list) else ([old], [new]))):
        if edited.count(before) != 1:
            return False, (f"{'day87_fast' if fast else 'the answer key'} no longer has the "
                           f"text this mistake edits ({file}: {before[:60]!r})")
        edited = edited.replace(before, after)
    with open(path, "w") as source:
        source.write(edited)
    try:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=cache)
        run = fast_table(copy) if fast else subprocess.run(
            [sys.executable, "test_op.py"], cwd=copy, env=env, capture_output=True, text=True,
            timeout=1200)
        if where == "import":
            # The import's error, from its first line: the cause comes first, then the build's log.
            # The next import, from a warm cache where the library built, must say it again.
            again = subprocess.run([sys.executable, "-c", "import op"], cwd=copy, env=env,
                                   capture_output=True, text=True, timeout=1200)
            told, again = (text[text.rfind("Error: day87:") + len("Error: "):][:1500]
                           if "Error: day87:" in text else text[-1500:]
                           for text in (run.stderr.strip(), again.stderr.strip()))
            named = run.returncode != 0 and all(says(told, word) and says(again, word)
                                                for word in words)
            if not all(says(again, word) for word in words):
                told += f"\n(the next import said: {again[:300]})"
        else:
            told = row_text(run.stdout, where)
            named = told is not None and all(says(told, word) for word in words)
            told = told or f"row '{where}' did not fail; the run ended: {run.stdout.strip()[-300:]}"
            # The exercise's other rows that failed too (on a GPU, its CUDA rows).
            also = [line.split(" FAIL, ", 1) for line in run.stdout.splitlines()
                    if line.startswith("6 exercise") and " FAIL, " in line
                    and not line.startswith(where)]
            told += "".join(f"\nalso row '{row.split('  ')[0]}': {detail}" for row, detail in also)
        given_away = answer_given_away(run.stdout + "\n" + run.stderr)
        if given_away:
            named, told = False, f"{told}\nTHE OUTPUT GIVES THE ANSWER AWAY: {given_away[:300]}"
        return named, told
    finally:
        with open(path, "w") as source:
            source.write(text)


def main():
    if sys.argv[1:] == ["--list"]:
        for name, file, _, _, where, words, runs_on in MISTAKES:
            shown = [word.pattern if isinstance(word, re.Pattern) else word for word in words]
            print(f"{name} ({file}, {runs_on}): {where} must say {shown}")
        return
    import torch  # after --list, which needs no torch

    have_gpu, on_gpu = torch.cuda.is_available(), sys.argv[1:] == ["--on-gpu"]
    unnamed = 0
    with tempfile.TemporaryDirectory(prefix="day87-mistakes-") as scratch:
        copy, cache = os.path.join(scratch, "solved"), os.path.join(scratch, "cache")
        print(f"student_mistakes: each mistake laid over {solved_copy(copy, from_key=True)}, "
              "one at a time")
        fast_copy, fast_source = fast_package_copy(os.path.join(scratch, "fast-package"))
        print(f"day87_fast's over a copy of {fast_source}\n" if fast_copy else
              f"day87_fast's skipped: {fast_source}\n")
        print(f"{'mistake':<58}{'verdict':<12}what the student is told")
        for mistake in MISTAKES:
            name, runs_on = mistake[0], mistake[-1]
            fast = mistake[1].startswith(FAST_PACKAGE)
            if on_gpu and runs_on == "cpu":
                continue
            if runs_on == "gpu" and not have_gpu:
                print(f"{name:<58}{'skip':<12}a GPU shows this one, and none is visible")
                continue
            if fast and not fast_copy:
                print(f"{name:<58}{'skip':<12}{fast_source}")
                continue
            named, told = try_mistake(fast_copy if fast else copy, cache, mistake)
            unnamed += not named
            first, *rest = told.splitlines() or [""]
            print(f"{name:<58}{'named' if named else 'NOT NAMED':<12}{first[:400]}", flush=True)
            for line in rest:
                print(f"{'':<70}{line.strip()[:400]}")
    print(f"\nstudent_mistakes: {unnamed} mistake(s) not named")
    sys.exit(unnamed)


if __name__ == "__main__":
    main()
