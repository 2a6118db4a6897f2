"""test_wheel.py: what makes day87_fast a wheel on the stable ABI, checked on the installed
package (`pip install --no-build-isolation ./fast`).

    cd fast && python -m pytest tests/test_wheel.py

- The CUDA library calls no C++ function of libtorch, only the stable ABI's C functions:
  what lets one build load in later torch versions. The same check finds libtorch's C++
  symbols in the lesson's library (the classic API), or it proves nothing.
- The package stands alone: importing it imports nothing from the lesson's folder.
- Its copies of the lesson hold: fast/csrc/binding.cpp's messages equal the lesson's
  binding.cpp's, whole, for the same bad calls; lesson_copy.py's Python checks equal
  op.py's; its backward formula gives op.py's gradients. Where day87_fast departs, this
  file states how (DEPARTURES): its CPU reference takes b column-major, its 'contiguous'
  message names both of b's layouts, and its CUDA refusal of a ragged M says what the CPU
  takes, in the binding's words and the fake's alike.
- setup.py: sm_90a joins a list that names 9.0, and only such a list; a compiler that links
  libstdc++ statically is caught before it builds; a toolkit without cuBLAS is refused,
  cuBLAS named.
"""

import importlib.util
import os
import re
import shutil
import stat
import subprocess
import sys

import pytest
import torch

from tests.lesson_folder import LESSON  # and the lesson's op.py importable

import day87_fast  # noqa: E402  the installed package
from day87_fast import lesson_copy  # noqa: E402

FAST = os.path.join(LESSON, "fast")


def setup_module_file():
    """fast/setup.py as a module: its functions, without running setup()."""
    spec = importlib.util.spec_from_file_location("day87_fast_setup",
                                                  os.path.join(FAST, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def libtorch_cxx_symbols(library):
    """The C++ functions of libtorch (at::, c10::, torch::) that `library` needs: its
    undefined dynamic symbols, demangled."""
    undefined = subprocess.run(["nm", "-D", "--undefined-only", library], check=True,
                               capture_output=True, text=True).stdout.split()
    names = subprocess.run(["c++filt"], input="\n".join(undefined), check=True,
                           capture_output=True, text=True).stdout.splitlines()
    return sorted({name for name in names if re.match(r"(at|c10|torch)::", name)})


@pytest.mark.skipif(not shutil.which("nm") or not shutil.which("c++filt"),
                    reason="binutils' nm and c++filt are needed")
def test_library_calls_only_the_stable_c_functions():
    import op  # the lesson: a library of the classic API, for the check's own control
    classic = libtorch_cxx_symbols(op.BUILD["library"])
    assert classic, f"the check finds no libtorch C++ symbol in {op.BUILD['library']}"
    stable = libtorch_cxx_symbols(day87_fast.BUILD["library"])
    assert not stable, f"{day87_fast.BUILD['library']} needs libtorch's C++: {stable[:5]}"


def test_package_imports_nothing_from_the_lesson(tmp_path):
    # A fresh process, from a folder outside the repository, with no PYTHONPATH.
    probe = ("import sys, day87_fast; "
             "print(day87_fast.__file__); "
             "print(sorted(name for name, module in sys.modules.items() "
             "if getattr(module, '__file__', None) and "
             f"module.__file__.startswith({LESSON + os.sep!r})))")
    environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, env=environment,
                         capture_output=True, text=True)
    assert ran.returncode == 0, ran.stderr[-2000:]
    location, from_lesson = ran.stdout.splitlines()
    assert not location.startswith(LESSON + os.sep), f"day87_fast came from the tree: {location}"
    assert from_lesson == "[]", f"importing day87_fast imported from the lesson: {from_lesson}"


def bad_cpu_calls():
    """(what is wrong, a, b): CPU calls that break one rule each; rule order decides the
    message where two would."""
    def double(*shape):
        return torch.randn(*shape, dtype=torch.float64)
    offset = double(3 * 4 + 1)[1:].view(3, 4)
    return [
        ("a 1-D", double(4), double(4, 5)),
        ("a on meta", double(3, 4).to("meta"), double(4, 5)),
        ("float32", double(3, 4).float(), double(4, 5)),
        ("float16 and float64", double(3, 4).half(), double(4, 5)),
        ("a transposed", double(4, 3).t(), double(4, 5)),
        ("b column-major", double(3, 4), double(5, 4).t()),
        ("b every second column", double(3, 4), double(4, 10)[:, ::2]),
        ("inner dimensions", double(3, 4), double(5, 5)),
        ("a view off 16 bytes", offset, double(4, 5)),
        ("empty, fine", double(0, 4), double(4, 5)),
    ]


def message_of(call, *arguments):
    try:
        call(*arguments)
    except (RuntimeError, NotImplementedError, TypeError) as error:
        return f"{type(error).__name__}: {error}"
    return "no error"


def lesson_words(message):
    return message.replace("day87_fast::", "day87::")


# Where day87_fast's binding departs from the lesson's (fast/src/day87_fast/layouts.py): the
# bad CPU calls whose outcome differs, each with how it follows from the lesson's. Every
# other call's message is the lesson's, whole.
LESSONS_CONTIGUOUS = "a and b must be row-major contiguous"
FAST_CONTIGUOUS = ("a must be row-major contiguous, and b row-major (strides (N, 1)) or "
                   "column-major (strides (1, K))")
DEPARTURES = {
    "b column-major": lambda lessons: "no error",  # the CPU reference reads it in place
    "a transposed": lambda lessons: lessons.replace(LESSONS_CONTIGUOUS, FAST_CONTIGUOUS),
    "b every second column": lambda lessons: lessons.replace(LESSONS_CONTIGUOUS,
                                                             FAST_CONTIGUOUS),
}


@pytest.mark.parametrize("wrong, a, b", bad_cpu_calls(), ids=[row[0] for row in bad_cpu_calls()])
def test_binding_messages_equal_the_lessons(wrong, a, b):
    import op
    ours = message_of(torch.ops.day87_fast.wmma_mm, a, b)
    lessons = message_of(torch.ops.day87.wmma_mm, a, b)
    if wrong in DEPARTURES:
        assert LESSONS_CONTIGUOUS in lessons, lessons  # the lesson refuses it, by that rule
    assert lesson_words(ours) == DEPARTURES.get(wrong, lambda said: said)(lessons), ours


@pytest.mark.parametrize("m, n", [(100, 128), (128, 100), (100, 100)],
                         ids=["M ragged", "N ragged", "both ragged"])
def test_cuda_tile_messages_depart_for_a_ragged_m(m, n):
    # The fake's CUDA rules, on fake CUDA tensors (no GPU needed): the tile message is
    # op.py's, with RAGGED_M_ON_CUDA after it where M breaks the rule.
    import op
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        a = torch.empty(m, 16, dtype=torch.half, device="cuda")
        b = torch.empty(16, n, dtype=torch.half, device="cuda")
        copied = message_of(lesson_copy.check_matrices, "day87::wmma_mm", a, b)
        lessons = message_of(op.check_matrices, "day87::wmma_mm", a, b)
    assert "rule 'tile'" in lessons, lessons
    note = f"; {lesson_copy.RAGGED_M_ON_CUDA}" if m % lesson_copy.TILE_M else ""
    assert copied == lessons + note, copied


def test_binding_and_fake_say_the_ragged_m_note_alike():
    # The CUDA binding's note cannot run here: its text is read from binding.cpp.
    from tests.layout_checks import binding_text
    assert binding_text("kRaggedMOnCuda") == lesson_copy.RAGGED_M_ON_CUDA


@pytest.mark.parametrize("bias", [torch.randn(4, dtype=torch.float64),
                                  torch.randn(5, dtype=torch.float32),
                                  torch.randn(5, 2, dtype=torch.float64)[:, 0],
                                  torch.randn(1, 5, dtype=torch.float64)],
                         ids=["wrong length", "float32", "strided", "2-D"])
def test_bias_messages_equal_the_fakes(bias):
    # The lesson's binding has no bias: the C++ bias rules are held to the fake's, which
    # torch.compile raises with (row 8 holds eager and compiled messages equal too).
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
    eager = message_of(torch.ops.day87_fast.wmma_mm_bias, a, b, bias)
    assert "rule 'bias'" in eager or "rule 'dtype'" in eager or "rule 'contiguous'" in eager, eager
    if "rule 'contiguous'" not in eager:  # contiguity is not the fake's to check
        from torch._subclasses.fake_tensor import FakeTensorMode
        with FakeTensorMode() as mode:
            fake = message_of(torch.ops.day87_fast.wmma_mm_bias, mode.from_tensor(a),
                              mode.from_tensor(b), mode.from_tensor(bias))
        assert fake == eager, (fake, eager)


@pytest.mark.parametrize("wrong, a, b", bad_cpu_calls(), ids=[row[0] for row in bad_cpu_calls()])
def test_python_checks_equal_the_lessons(wrong, a, b):
    import op
    copied = message_of(lesson_copy.check_matrices, "day87::wmma_mm", a, b)
    assert copied == message_of(op.check_matrices, "day87::wmma_mm", a, b), copied
    for value in (None, [[1.0]]):
        assert (message_of(lesson_copy.check_tensors, "day87::wmma_mm", value, b)
                == message_of(op.check_tensors, "day87::wmma_mm", value, b))
    copied_tile = (lesson_copy.TILE_M, lesson_copy.TILE_N, lesson_copy.TILE_K)
    assert copied_tile == (op.TILE_M, op.TILE_N, op.TILE_K), copied_tile


def test_backward_formula_equals_the_lessons():
    import op
    a = torch.randn(6, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
    grad = torch.randn(6, 5, dtype=torch.float64)
    for wanted in [(True, True), (True, False), (False, True)]:
        a.requires_grad_(wanted[0])
        b.requires_grad_(wanted[1])
        ours = torch.autograd.grad(day87_fast.wmma_mm(a, b), [t for t in (a, b)
                                                                if t.requires_grad], grad)
        lessons = torch.autograd.grad(op.wmma_mm(a, b), [t for t in (a, b)
                                                         if t.requires_grad], grad)
        for mine, theirs in zip(ours, lessons):
            torch.testing.assert_close(mine, theirs, rtol=0, atol=0)


def test_hopper_target_joins_a_list_that_names_9_0():
    setup = setup_module_file()
    hopper = (setup.HOPPER_ARCHITECTURE,)
    assert setup.hopper_architectures(setup.ARCHITECTURES) == hopper, "the wheel's own list"
    assert setup.hopper_architectures("9.0+PTX") == hopper, "an H100 or H200 user's"
    assert setup.hopper_architectures("8.0;9.0") == hopper
    assert setup.hopper_architectures("9.0a") == (), "the list has it already"
    assert setup.hopper_architectures("7.5+PTX") == (), "the T4's code, asked for"
    assert setup.hopper_architectures("8.0+PTX") == (), "no Hopper card to run it"


@pytest.mark.skipif(not torch.version.cuda, reason="a CPU-only torch: the CPU library alone")
def test_wheel_holds_every_architecture():
    expected = setup_module_file().architectures()
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        pytest.skip("TORCH_CUDA_ARCH_LIST is set: the installed wheel may be a full one")
    assert day87_fast.BUILD["with_cuda"], "torch has CUDA and the CUDA library did not load"
    assert day87_fast.BUILD["archs"] == expected, (day87_fast.BUILD["archs"], expected)


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ to wrap")
def test_static_libstdcxx_compiler_caught(tmp_path, monkeypatch):
    setup = setup_module_file()
    wrapper = tmp_path / "static-g++"
    wrapper.write_text('#!/bin/sh\nexec g++ "$@" -static-libstdc++\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    assert setup.needs_shared_libstdcxx("g++") is True
    assert setup.needs_shared_libstdcxx(str(wrapper)) is False
    assert setup.needs_shared_libstdcxx(str(tmp_path / "no-such-compiler")) is None
    monkeypatch.setenv("CXX", str(wrapper))
    assert setup.choose_compiler() == {"CXX": "/usr/bin/g++", "CC": "/usr/bin/g++"}


@pytest.mark.skipif(not torch.version.cuda, reason="a CPU-only torch: no cuBLAS is looked for")
def test_toolkit_without_cublas_refused(tmp_path, monkeypatch):
    setup = setup_module_file()
    (tmp_path / "include").mkdir()
    monkeypatch.setattr(setup.cpp_extension, "CUDA_HOME", str(tmp_path))
    monkeypatch.setitem(sys.modules, "nvidia", None)  # torch's nvidia wheels hidden
    with pytest.raises(SystemExit, match="cublas_v2.h and libcublas"):
        setup.cublas_folders()
