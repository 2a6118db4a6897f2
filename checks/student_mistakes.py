"""student_mistakes.py: the exercise's likely mistakes, each laid over the answer key, must be named.

    python checks/student_mistakes.py              # every mistake this machine can show
    python checks/student_mistakes.py --on-gpu     # on a GPU: those a GPU shows, and those
                                                   # whose CUDA rows answer too (CI runs the rest)
    python checks/student_mistakes.py --list       # the mistakes, what each must be told

Each mistake is one text edit of a file of the solved lesson (checks/solved.py
--key: the answer key on a copy). On that copy `python test_op.py` runs as a student
runs it, and the mistake is named when the row it belongs to FAILs with words that
give its cause and where the fix goes (or, for a build that fails, when the import's
error does, and the next import says that the last build failed). The copies share
one build cache: a mistake in op.py alone reuses the key's build. A mistake that
only a GPU shows is skipped without one; --on-gpu runs those and the ones whose
CUDA rows answer too. The exit status is the number of mistakes
not named.
"""

import os
import subprocess
import sys
import tempfile

from solved import solved_copy

# (mistake, file, the key's text, the mistake's text, where it must show, words it must say, where it
# runs). "where" is a row of test_op.py, "any row" (the first row to fail), or "import". A mistake of
# several edits gives lists of texts. It runs on "cpu" (every machine, CI), "gpu" (a GPU shows it), or
# "both": everywhere, and again with --on-gpu, where the CUDA rows answer it too.
MISTAKES = [
    ("no backward registered", "op.py",
     '''    torch.library.register_autograd("day87::wmma_mm_bias", _backward_bias,
                                    setup_context=_setup_context_bias, lib=library)
''', "", "6 exercise: gradient", ["no backward is registered", "register_autograd", "op.py's _register"], "both"),
    ("no fake registered", "op.py",
     '''    torch.library.register_fake("day87::wmma_mm_bias", _fake_bias, lib=library)
''', "", "6 exercise: fake", ["no fake implementation is registered", "register_fake"], "cpu"),
    ("the fake returns the input's dtype", "op.py",
     '''        f"got bias: {described(bias)}"))
    return a.new_empty((a.shape[0], b.shape[1]), dtype=accumulate_dtype(a.dtype))''',
     '''        f"got bias: {described(bias)}"))
    return a.new_empty((a.shape[0], b.shape[1]), dtype=a.dtype)''',
     "6 exercise: fake", ["torch.float16", "accumulate_dtype(a.dtype), not the input's"], "both"),
    ("setup_context saves the bias instead of a and b", "op.py",
     "    _setup_context(ctx, inputs[:2], output)", "    ctx.save_for_backward(inputs[2])",
     "6 exercise: gradient", ["not enough values to unpack", "op.py:", "setup_context saves"], "cpu"),
    ("setup_context saves b, a", "op.py",
     "    _setup_context(ctx, inputs[:2], output)", "    ctx.save_for_backward(inputs[1], inputs[0])",
     "6 exercise: gradient", ["op.py:", "in the same order"], "cpu"),
    ("grad_bias summed over the wrong axis", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.sum(1) if",
     "6 exercise: gradient", ["summed over the wrong axis", "shape [6]", "op.py:", "_backward_bias"], "cpu"),
    ("grad_bias a mean, not a sum", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.mean(0) if",
     "6 exercise: gradient", ["a mean", "op.py:", "_backward_bias"], "cpu"),
    ("no grad_bias returned", "op.py",
     "grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None", "grad_bias = None",
     "6 exercise: gradient", ["returns None for the bias", "op.py:", "_backward_bias"], "cpu"),
    # Autograd casts it back to the bias's dtype: the CPU sees the rounding, a GPU the
    # column sums past FP16's largest value (8192 rows of gradients near 10) as inf.
    ("grad_bias rounded through FP16", "op.py",
     "grad_bias = grad.sum(0) if", "grad_bias = grad.sum(0).half() if",
     "6 exercise: gradient", ["narrower dtype", "op.py:", "_backward_bias"], "both"),
    ("no op.wmma_mm_bias wrapper", "op.py",
     '''def wmma_mm_bias(a, b, bias):
    """a @ b + bias through day87::wmma_mm_bias, the bias added in the kernel's store:
    float16 a, b and float32 bias in, float32 out on CUDA; float64 on the CPU."""
    check_tensors("day87::wmma_mm_bias", a, b)
    return torch.ops.day87.wmma_mm_bias(a, b, bias)
''', "", "6 exercise: wrapper", ["op.py has no wmma_mm_bias", "beside wmma_mm"], "cpu"),
    ("the fake has none of the bias's checks", "op.py",
     ['''    torch._check(bias.device == a.device, lambda: (
        f"{op_name}: rule 'one device': bias must be on a's device; "
        f"got a: {described(a)}, bias: {described(bias)}"))
''', '''    torch._check(bias.dim() == 1 and bias.shape[0] == b.shape[1], lambda: (
        f"{op_name}: rule 'bias': bias must be 1-D with one value per column of b; "
        f"got bias: {described(bias)}, b: {described(b)}"))
    torch._check(bias.dtype == accumulate_dtype(a.dtype), lambda: (
        f"{op_name}: rule 'dtype': on {bias.device} bias must be {accumulate_dtype(a.dtype)}; "
        f"got bias: {described(bias)}"))
'''], ["", ""], "6 exercise: contract", ["(fake cuda)", "op.py's fake for day87::wmma_mm_bias"], "cpu"),
    ("the fake checks the bias's device after a and b", "op.py",
     '''    torch._check(bias.device == a.device, lambda: (
        f"{op_name}: rule 'one device': bias must be on a's device; "
        f"got a: {described(a)}, bias: {described(bias)}"))
    check_matrices(op_name, a, b)
''', '''    check_matrices(op_name, a, b)
    torch._check(bias.device == a.device, lambda: (
        f"{op_name}: rule 'one device': bias must be on a's device; "
        f"got a: {described(a)}, bias: {described(bias)}"))
''', "6 exercise: contract", ["names 'one device' first", "op.py's fake"], "cpu"),
    ("the bias's contract left out (CPU)", "binding.cpp",
     '''    checkContractWithBias("day87::wmma_mm_bias", a, b, bias, at::kDouble, at::kDouble,
                          /*tile_rules=*/false);''',
     '''    checkContract("day87::wmma_mm_bias", a, b, at::kDouble, /*tile_rules=*/false);''',
     "6 exercise: contract", ["rule 'bias'", "(cpu)", "in binding.cpp"], "cpu"),
    ("the schema names the bias c", "binding.cpp",
     '''m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor");''',
     '''m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor c) -> Tensor");''',
     "6 exercise: wrapper", ["schema's arguments are (a, b, c)", "m.def"], "cpu"),
    ("the impl's name misspelt", "binding.cpp",
     'm.impl("wmma_mm_bias", &wmmaMmBiasCpu);', 'm.impl("wmma_mm_bais", &wmmaMmBiasCpu);',
     "6 exercise: forward", ["no CPU implementation", "wmma_mm_bais", "binding.cpp"], "cpu"),
    ("no CPU implementation", "binding.cpp",
     '''    m.impl("wmma_mm_bias", &wmmaMmBiasCpu);
''', "", "6 exercise: forward", ["no CPU implementation", "TORCH_LIBRARY_IMPL(day87, CPU, m)"], "cpu"),
    ("the bias broadcast along rows (CPU)", "binding.cpp",
     "return at::addmm(bias, a, b);", "return at::addmm(bias.unsqueeze(1), a, b);",
     "6 exercise: forward", ["3x4x5: the forward raised"], "cpu"),
    ("launchWmmaGemm changed in kernel.cu only", "binding.cpp",
     # binding.cpp's declaration and call as before the exercise, kernel.cu's definition changed
     ['''cudaError_t launchWmmaGemm(const __half* a, const __half* b, const float* bias, float* c,
                           size_t m, size_t n, size_t k, cudaStream_t stream);''',
      "b.const_data_ptr<at::Half>()), bias, c.mutable_data_ptr<float>(),"],
     ['''cudaError_t launchWmmaGemm(const __half* a, const __half* b, float* c, size_t m, size_t n,
                           size_t k, cudaStream_t stream);''',
      "b.const_data_ptr<at::Half>()), c.mutable_data_ptr<float>(),"],
     "import", ["nothing defines launchWmmaGemm(", "binding.cpp's declaration of launchWmmaGemm"], "cpu"),
    ("a compile error in kernel.cu", "kernel.cu",
     "value.x + operands.bias[col],", "value.x + operands.bias[column],",
     "import", ["Its first error:", "kernel.cu:", "column"], "cpu"),
    # A GPU shows these.
    ("the bias added with no null check", "kernel.cu",
     "    if (operands.bias)  // bias[j] is added to every row of column j, once\n        value =",
     "    value =", "any row", ["illegal memory access", "wmma_mm passes no bias (nullptr)"], "gpu"),
    ("the bias indexed by row in storeOutputs", "kernel.cu",
     "value.x + operands.bias[col], value.y + operands.bias[col + 1],",
     "value.x + operands.bias[row], value.y + operands.bias[row], ",
     "6 exercise: cuda forward", ["of the bound"], "gpu"),
    ("no CUDA implementation", "binding.cpp",
     '''    m.impl("wmma_mm_bias", &wmmaMmBiasCuda);
''', "", "6 exercise: cuda forward", ["no CUDA implementation", "TORCH_LIBRARY_IMPL(day87, CUDA, m)"], "gpu"),
]


def row_text(output, where):
    """The FAIL line of row `where` (with its continuation lines), or None."""
    lines = output.splitlines()
    for index, line in enumerate(lines):
        if (line.startswith(where) or where == "any row") and " FAIL, " in line:
            following = []
            for more in lines[index + 1:]:
                if not more.startswith("    "):
                    break
                following.append(more)
            row = line.split(" FAIL, ", 1)[0].split("  ")[0]
            return "\n".join([f"row '{row}': {line.split(' FAIL, ', 1)[1]}"] + following)
    return None


def try_mistake(copy, cache, mistake):
    """(named, what the student is told) for one mistake on `copy`."""
    name, file, old, new, where, words, _ = mistake
    path = os.path.join(copy, file)
    with open(path) as source:
        text = source.read()
    edited = text
    for before, after in zip(*((old, new) if isinstance(old, list) else ([old], [new]))):
        if edited.count(before) != 1:
            return False, f"the answer key no longer has the text this mistake edits ({file}: {before[:60]!r})"
        edited = edited.replace(before, after)
    with open(path, "w") as source:
        source.write(edited)
    try:
        env = dict(os.environ, TORCH_EXTENSIONS_DIR=cache)
        run = subprocess.run([sys.executable, "test_op.py"], cwd=copy, env=env, capture_output=True,
                             text=True, timeout=1200)
        if where == "import":
            told = run.stderr.strip()[-1500:]
            again = subprocess.run([sys.executable, "-c", "import op"], cwd=copy, env=env, capture_output=True,
                                   text=True, timeout=1200)
            said_failed = "failed (" in again.stderr and "building again" in again.stderr
            named = run.returncode != 0 and all(word in told for word in words) and said_failed
            told = told[told.rfind("day87:"):] if "day87:" in told else told
            if not said_failed:
                told += "\n(the next import did not say that the last build failed)"
        else:
            told = row_text(run.stdout, where)
            named = told is not None and all(word in told for word in words)
            told = told or f"row '{where}' did not fail; the run ended: {run.stdout.strip()[-300:]}"
            # The exercise's other rows that failed too (on a GPU, its CUDA rows).
            also = [line.split(" FAIL, ", 1) for line in run.stdout.splitlines()
                    if line.startswith("6 exercise") and " FAIL, " in line and not line.startswith(where)]
            told += "".join(f"\nalso row '{row.split('  ')[0]}': {detail}" for row, detail in also)
        return named, told
    finally:
        with open(path, "w") as source:
            source.write(text)


def main():
    if sys.argv[1:] == ["--list"]:
        for name, file, _, _, where, words, runs_on in MISTAKES:
            print(f"{name} ({file}, {runs_on}): {where} must say {words}")
        return
    import torch  # after --list, which needs no torch

    have_gpu, on_gpu = torch.cuda.is_available(), sys.argv[1:] == ["--on-gpu"]
    unnamed = 0
    with tempfile.TemporaryDirectory(prefix="day87-mistakes-") as scratch:
        copy, cache = os.path.join(scratch, "solved"), os.path.join(scratch, "cache")
        print(f"student_mistakes: each mistake laid over {solved_copy(copy, from_key=True)}, one at a time\n")
        print(f"{'mistake':<50}{'verdict':<12}what the student is told")
        for mistake in MISTAKES:
            name, runs_on = mistake[0], mistake[-1]
            if on_gpu and runs_on == "cpu":
                continue
            if runs_on == "gpu" and not have_gpu:
                print(f"{name:<50}{'skip':<12}a GPU shows this one, and none is visible")
                continue
            named, told = try_mistake(copy, cache, mistake)
            unnamed += not named
            first, *rest = told.splitlines() or [""]
            print(f"{name:<50}{'named' if named else 'NOT NAMED':<12}{first[:400]}", flush=True)
            for line in rest:
                print(f"{'':<62}{line.strip()[:400]}")
    print(f"\nstudent_mistakes: {unnamed} mistake(s) not named")
    sys.exit(unnamed)


if __name__ == "__main__":
    main()
