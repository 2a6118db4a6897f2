"""test_install.py: the install and the loading, checked on the installed package (no GPU).

    cd fast && python -m pytest tests/test_install.py

- setup.py's copies of op.py's toolkit search and libstdc++ probe are op.py's, statement for
  statement; a copy changed by one name is seen to differ.
- setup.py makes the toolkit it finds cpp_extension's, and refuses, before compiling, no
  toolkit, a toolkit of another CUDA major than torch's, an isolated build (no torch to
  build against) and a setuptools that cannot build a wheel by itself.
- The version has one source: setup.py reads the package's __version__, and the installed
  metadata says the same.
- The installed package: `import day87_fast` prints nothing; dir() shows its API alone.
- A library that does not load is reported in the loader's words: a planted undefined symbol
  and a planted missing library, each named; a CUDA major other than the build's is named
  as such; a second copy in one process is refused.
"""

import ast
import importlib.metadata
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from tests.lesson_folder import LESSON
from tests.test_wheel import FAST, setup_module_file

import day87_fast  # noqa: E402  the installed package

# op.py's functions that fast/setup.py holds copies of (the lesson may not import fast/,
# and fast/ may not import the lesson at build time), each with a change of one name that
# the comparison must see: the search's last folder, the fix's extras, the probe's soname,
# readelf's field.
COPIED = {"find_toolkit": ('"/usr/local/cuda"', '"/opt/cuda"'),
          "toolkit_fix": ("[nvcc,cccl]", "[nvcc]"),
          "needs_libstdcxx": ('"libstdc++.so.6"', '"libstdc++.so"'),
          "needed_libraries": (r"\(NEEDED\)", r"\(NEEDED\) ")}
PACKAGE = os.path.dirname(day87_fast.__file__)


def function_tree(source, name):
    """The statements of the top-level function `name` in `source`: ast.dump leaves out
    comments and line numbers, and a docstring is dropped, so a copy may explain itself."""
    function = next(node for node in ast.parse(source).body
                    if isinstance(node, ast.FunctionDef) and node.name == name)
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    return ast.dump(ast.Module(body=body, type_ignores=[]))


def read(*parts):
    with open(os.path.join(*parts)) as file:
        return file.read()


@pytest.mark.parametrize("name", COPIED)
def test_setup_copies_equal_op_py(name):
    lesson = read(LESSON, "op.py")
    assert function_tree(read(FAST, "setup.py"), name) == function_tree(lesson, name), \
        f"fast/setup.py's {name} is not op.py's: copy op.py's anew"
    old, new = COPIED[name]
    assert old in ast.get_source_segment(lesson, next(
        node for node in ast.parse(lesson).body if getattr(node, "name", None) == name))
    changed = lesson.replace(old, new)
    assert function_tree(changed, name) != function_tree(lesson, name), f"{name}: {old} unseen"


def fake_toolkit(folder, release):
    """A folder that find_toolkit takes for a toolkit, whose nvcc says it is CUDA `release`."""
    (folder / "bin").mkdir(parents=True)
    (folder / "include").mkdir()
    (folder / "include" / "cuda_runtime.h").write_text("")
    nvcc = folder / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, "
                    f"V{release}.0'\n")
    nvcc.chmod(0o755)
    return folder


def other_major():  # a CUDA release of another major version than torch's
    return f"{int(torch.version.cuda.split('.')[0]) - 1}.8"


@pytest.fixture
def setup_script(monkeypatch):
    """fast/setup.py as a module; CUDA_HOME and cpp_extension.CUDA_HOME restored after."""
    module = setup_module_file()
    monkeypatch.setattr(module.cpp_extension, "CUDA_HOME", module.cpp_extension.CUDA_HOME)
    for name in ("CUDA_HOME", "CUDA_PATH"):  # use_toolkit sets CUDA_HOME: set first, so that
        monkeypatch.setenv(name, "")          # the value before the test is what comes back
        monkeypatch.delenv(name)
    monkeypatch.setitem(sys.modules, "nvidia", None)  # pip's toolkit, if any, hidden
    return module


needs_cuda_torch = pytest.mark.skipif(not torch.version.cuda,
                                      reason="a CPU-only torch: no toolkit is looked for")


@needs_cuda_torch
def test_setup_uses_the_toolkit_it_finds(setup_script, tmp_path, monkeypatch):
    # nvcc on PATH is a link into the toolkit: the folder above its real path, as op.py
    # looks, and not torch's guess (the folder above the link).
    toolkit = fake_toolkit(tmp_path / "toolkit", torch.version.cuda)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "nvcc").symlink_to(toolkit / "bin" / "nvcc")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:{os.environ['PATH']}")
    found = setup_script.use_toolkit()
    assert found["home"] == str(toolkit), found
    assert setup_script.cpp_extension.CUDA_HOME == str(toolkit) == os.environ["CUDA_HOME"]
    monkeypatch.setenv("CUDA_HOME", str(toolkit))  # named: taken as it is
    assert setup_script.use_toolkit()["home"] == str(toolkit)


@needs_cuda_torch
def test_setup_refuses_no_toolkit(setup_script, tmp_path, monkeypatch):
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(SystemExit) as refused:
        setup_script.use_toolkit()
    message = str(refused.value)
    assert "no CUDA toolkit is found" in message, message
    assert f"CUDA_HOME={tmp_path} holds no bin/nvcc" in message, message
    assert f"Fix: CUDA_HOME=(the folder of a CUDA {torch.version.cuda.split('.')[0]} toolkit)" \
        in message, message


@needs_cuda_torch
def test_setup_refuses_another_cuda_major(setup_script, tmp_path, monkeypatch):
    release = other_major()
    monkeypatch.setenv("CUDA_HOME", str(fake_toolkit(tmp_path / "toolkit", release)))
    with pytest.raises(SystemExit) as refused:
        setup_script.use_toolkit()
    message = str(refused.value)
    assert f"nvcc of CUDA {release}" in message, message
    assert f"torch {torch.__version__} is built with CUDA {torch.version.cuda}" in message
    assert f"a torch built with CUDA {release.split('.')[0]}" in message, message


def run_setup(tmp_path, prelude, **environment):
    """fast/setup.py run as pip runs it (as __main__), after `prelude`, in a fresh process."""
    code = f"{prelude}\nimport runpy\nrunpy.run_path('setup.py', run_name='__main__')"
    return subprocess.run([sys.executable, "-c", code, "--name"], cwd=FAST,
                          capture_output=True, text=True,
                          env={**os.environ, "TMPDIR": str(tmp_path), **environment})


def test_isolated_build_refused(tmp_path):
    # An isolated build's environment has no torch: setup.py says so, and how to build.
    ran = run_setup(tmp_path, "import sys; sys.modules['torch'] = None")
    assert ran.returncode != 0, ran.stdout
    assert "no torch to build against" in ran.stderr, ran.stderr
    assert "pip install --no-build-isolation ./fast" in ran.stderr, ran.stderr


def test_old_setuptools_refused(tmp_path):
    old = tmp_path / "setuptools"
    old.mkdir()
    (old / "__init__.py").write_text("__version__ = '65.5.0'\n")
    ran = run_setup(tmp_path, "", PYTHONPATH=str(tmp_path))
    assert ran.returncode != 0, ran.stdout
    assert "setuptools 65.5.0 is older than 70.1" in ran.stderr, ran.stderr


def test_version_has_one_source():
    assert setup_module_file().package_version() == day87_fast.__version__
    assert importlib.metadata.version("day87_fast") == day87_fast.__version__, \
        "the installed metadata is not the package's version: reinstall day87_fast"


def test_namespace_holds_the_api():
    shown = dir(day87_fast)
    assert shown == ["BUILD", "Linear", "__version__", "wmma_mm", "wmma_mm_bias"], shown
    for name in shown:
        assert hasattr(day87_fast, name), name


def python_in(folder, code):
    """`code` in a fresh process run from `folder`, which comes first on its path (before
    the folder of an install with --target, where PYTHONPATH names one)."""
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-c", code], cwd=folder, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": path})


def test_import_prints_nothing(tmp_path):
    ran = python_in(tmp_path, "import day87_fast")
    assert ran.returncode == 0, ran.stderr
    assert (ran.stdout, ran.stderr) == ("", ""), (ran.stdout, ran.stderr)


def package_copy(folder):
    """The installed package's Python files and build.json, copied to folder/day87_fast,
    without its libraries: a test plants its own."""
    copy = folder / "day87_fast"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("*.so", "__pycache__"))
    return copy


PLANTED = {  # a C++ source that defines a function, a call of another, missing at load
    "undefined symbol": ("namespace tuned { void launchMissing(int); }\n"
                         "void launch() { tuned::launchMissing(1); }\n"),
    "missing library": "void helper();\nvoid launch() { helper(); }\n",
}


def plant(copy, what, tmp_path):
    """Both libraries of `copy` replaced by one that does not load, for the reason `what`."""
    compiler = shutil.which("g++")
    source = tmp_path / "planted.cpp"
    source.write_text(PLANTED[what])
    link = []
    if what == "missing library":  # linked against a library deleted after the link
        helper = tmp_path / "helper.cpp"
        helper.write_text("void helper() {}\n")
        subprocess.run([compiler, "-shared", "-fPIC", helper, "-o",
                        tmp_path / "libday87_planted.so"], check=True)
        link = [f"-L{tmp_path}", "-lday87_planted"]
    for kind in ("cuda", "cpu"):
        subprocess.run([compiler, "-shared", "-fPIC", source, "-o",
                        copy / f"_library_{kind}.abi3.so", *link], check=True)
    if link:
        os.remove(tmp_path / "libday87_planted.so")


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ to plant a library with")
def test_undefined_symbol_named(tmp_path):
    plant(package_copy(tmp_path), "undefined symbol", tmp_path)
    ran = python_in(tmp_path, "import day87_fast")
    assert ran.returncode != 0, ran.stdout
    assert "undefined symbol: _ZN5tuned13launchMissingEi" in ran.stderr, ran.stderr
    if shutil.which("c++filt"):
        assert "Nothing loaded defines tuned::launchMissing(int)" in ran.stderr, ran.stderr
    # Under a torch older than the wheel's floor, the symbol is taken for one it lacks.
    ran = python_in(tmp_path, "import torch; torch.__version__ = '2.10.0'; import day87_fast")
    floor = json.loads(read(tmp_path, "day87_fast", "build.json"))["torch_floor"]
    assert f"torch 2.10.0 lacks it: the wheel needs torch {floor} or later" in ran.stderr, \
        ran.stderr


@pytest.mark.skipif(not shutil.which("g++"), reason="no g++ to plant a library with")
def test_missing_library_named(tmp_path):
    plant(package_copy(tmp_path), "missing library", tmp_path)
    ran = python_in(tmp_path, "import day87_fast")
    assert ran.returncode != 0, ran.stdout
    assert "libday87_planted.so: cannot open shared object file" in ran.stderr, ran.stderr
    assert "The loader finds no libday87_planted.so" in ran.stderr, ran.stderr


@pytest.mark.skipif(not day87_fast.BUILD["cuda"], reason="built without CUDA: no CUDA library")
def test_cuda_major_mismatch_named(tmp_path):
    # A torch of another CUDA major than the build's, as a CUDA 12 torch is to a CUDA 13 build.
    built = day87_fast.BUILD["cuda"]
    other = f"{int(built.split('.')[0]) - 1}.8"
    ran = python_in(tmp_path, f"import torch; torch.version.cuda = {other!r}; import day87_fast")
    assert ran.returncode != 0, ran.stdout
    assert f"its CUDA library is built for CUDA {built}" in ran.stderr, ran.stderr
    assert f"is built with CUDA {other}" in ran.stderr, ran.stderr
    assert f"Fix: a torch built with CUDA {built.split('.')[0]}" in ran.stderr, ran.stderr


def test_second_copy_refused(tmp_path):
    # The installed package, then a copy of it from another folder, in one process.
    copies = tmp_path / "copies"
    shutil.copytree(PACKAGE, copies / "day87_fast", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import sys, day87_fast\n"
            "for name in [name for name in sys.modules if name.startswith('day87_fast')]:\n"
            "    del sys.modules[name]\n"
            f"sys.path.insert(0, {str(copies)!r})\n"
            "import day87_fast\n")
    ran = python_in(tmp_path, code)
    assert ran.returncode != 0, ran.stdout
    assert f"torch.ops.day87_fast is served by {day87_fast.BUILD['library']}" in ran.stderr, \
        ran.stderr
