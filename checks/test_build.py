"""test_build.py: the build and the import, on the machines students really have.

    python -m pytest checks/test_build.py          # every check (CI, no GPU)
    python -m pytest checks/test_build.py -k "keyed or concurrent or reload"   # on a GPU

Each test runs `import op` in fresh processes, against a fresh build cache and,
where it edits sources, a copy of the lesson's files, so that the repository and
the user's cache are never touched. Without a GPU, builds target sm_75 alone to
keep CI short; test_op.py's run in CI builds the whole architecture list.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from torch.utils import cpp_extension

LESSON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LESSON_FILES = ("kernel.cu", "binding.cpp", "op.py")
PRINT_BUILD = "import op; print(op.BUILD['directory'])"
PIP_TOOLKIT_FIX = f'pip install "cuda-toolkit[nvcc,cccl]=={torch.version.cuda}.*"'


def copy_lesson(folder):
    """A copy of the lesson's files, as the next lesson would make it."""
    folder.mkdir(parents=True)
    for name in LESSON_FILES:
        shutil.copy2(os.path.join(LESSON, name), folder)
    return str(folder)


def environment(cache, **extra):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(cache), PYTHONUNBUFFERED="1")
    if not torch.cuda.is_available():
        env["TORCH_CUDA_ARCH_LIST"] = "7.5"  # one architecture: a short build
    env.update(extra)
    return env


def import_op(folder, cache, code=PRINT_BUILD, timeout=900, **extra):
    return subprocess.run([sys.executable, "-c", code], cwd=folder, env=environment(cache, **extra),
                          capture_output=True, text=True, timeout=timeout)


def built(result):
    return "day87: building" in result.stderr


def succeeded(result, what):
    assert result.returncode == 0, \
        f"{what}: exit {result.returncode}: {result.stderr.strip()[-600:]}"
    return result.stdout.strip().splitlines()[-1]


def library_state(directory):
    """mtimes of what a compiler run or a cpp_extension.load() would rewrite."""
    return {name: os.stat(os.path.join(directory, name)).st_mtime_ns
            for name in ("day87_ext.so", "build.ninja")
            if os.path.exists(os.path.join(directory, name))}


def test_keyed_builds(tmp_path, monkeypatch):
    """Another torch, CUDA build or architecture list names another directory; a
    warm import runs no compiler; an edited kernel.cu rebuilds."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "key-cache"))
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0")
    import op  # builds once, into this test's own cache (conftest.py puts the lesson on sys.path)

    def keyed():  # the folder that op.py's build_and_load keys
        sources = [os.path.join(LESSON, name) for name in ("kernel.cu", "binding.cpp")]
        sources = sources if op.BUILD["with_cuda"] else sources[1:]
        return op.keyed_directory(sources, op.architectures() if op.BUILD["with_cuda"] else None)

    base = keyed()
    with monkeypatch.context() as patch:
        patch.setattr(torch, "__version__", "0.0.1")
        assert keyed() != base, "another torch version, same directory"
    if torch.version.cuda:
        with monkeypatch.context() as patch:
            patch.setattr(torch.version, "cuda", "99.0")
            assert keyed() != base, "another CUDA build, same directory"
        monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "9.0")
        assert keyed() != base, "another architecture list, same directory"

    folder, cache = copy_lesson(tmp_path / "keyed"), tmp_path / "keyed-cache"
    first = import_op(folder, cache)
    directory = succeeded(first, "cold import")
    assert built(first), "the cold import did not announce a build"
    for name in ("TORCH_EXTENSIONS_DIR", "TORCH_CUDA_ARCH_LIST"):  # as the import had them
        value = environment(cache).get(name)
        monkeypatch.setenv(name, value) if value else monkeypatch.delenv(name, raising=False)
    assert keyed() == directory, f"op.py built in {directory}, its key names {keyed()}"
    before = library_state(directory)
    second = import_op(folder, cache)
    assert succeeded(second, "warm import") == directory, "the warm import chose another directory"
    assert not built(second) and second.stderr.strip() == "", \
        f"the warm import printed: {second.stderr[:300]}"
    assert library_state(directory) == before, "the warm import rewrote the library or build.ninja"
    with open(os.path.join(folder, "kernel.cu"), "a") as kernel:
        kernel.write("\n// an edit\n")
    third = import_op(folder, cache)
    assert built(third) and succeeded(third, "import after an edit") != directory, \
        "editing kernel.cu did not rebuild into a new directory"


def test_copies_of_the_folder(tmp_path):
    """An edited copy builds its own library beside the original's; both run."""
    cache = tmp_path / "cache"
    original, edited = copy_lesson(tmp_path / "original"), copy_lesson(tmp_path / "next-lesson")
    with open(os.path.join(edited, "binding.cpp"), "a") as binding:
        binding.write("\n// the next lesson's change\n")
    first = succeeded(import_op(original, cache), "original")
    before = library_state(first)
    second = succeeded(import_op(edited, cache), "edited copy")
    assert first != second, "the edited copy reused the original's build directory"
    assert library_state(first) == before, "building the copy touched the original's library"
    check = ("import torch, op; a = torch.randn(3, 4, dtype=torch.float64); "
             "b = torch.randn(4, 5, dtype=torch.float64); "
             "print(torch.allclose(op.wmma_mm(a, b), a @ b))")
    for folder in (original, edited):
        assert succeeded(import_op(folder, cache, check), folder) == "True", \
            f"wrong result from {folder}"


def test_concurrent_first_import(tmp_path):
    """Two processes, one cold cache: one compiles, the other waits and loads. ninja logs
    each command it ran: every object and the library appear once."""
    folder, cache = copy_lesson(tmp_path / "concurrent"), tmp_path / "cache"
    processes = [subprocess.Popen([sys.executable, "-c", PRINT_BUILD], cwd=folder,
                                  env=environment(cache),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    results = [process.communicate(timeout=900) for process in processes]
    for process, (_, stderr) in zip(processes, results):
        assert process.returncode == 0, f"an import failed: {stderr.strip()[-400:]}"
    directory = results[0][0].strip().splitlines()[-1]
    assert results[1][0].strip().splitlines()[-1] == directory, \
        "the two imports loaded different builds"
    outputs = [line.split("\t")[3] for line in open(os.path.join(directory, ".ninja_log"))
               if not line.startswith("#")]
    assert "day87_ext.so" in outputs and len(outputs) == len(set(outputs)), \
        (f"the commands ninja ran: {outputs}: each output once, expected "
         "(exactly 1 process compiled)")


def test_killed_build(tmp_path):
    """SIGKILL mid-build leaves cpp_extension's lock file: the next import builds (on torch
    up to 2.13, whose lock is a file that blocks while it exists, it removes the file and says
    so). A lock held by a live process is waited for."""
    folder, cache = copy_lesson(tmp_path / "killed"), tmp_path / "cache"
    cache.mkdir()
    process = subprocess.Popen([sys.executable, "-c", "import op"], cwd=folder,
                               env=environment(cache), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, lock = time.monotonic() + 120, None
    while time.monotonic() < deadline and lock is None:
        lock = next((str(path) for path in cache.glob("*/lock")), None)
        time.sleep(0.05)
    assert lock is not None, "the build never created cpp_extension's lock file"
    time.sleep(1.0)  # let ninja start the compilers
    os.killpg(process.pid, signal.SIGKILL)  # the import, ninja and the compilers
    process.wait()
    assert os.path.exists(lock), "the kill left no lock file: nothing to recover from"
    again = import_op(folder, cache, timeout=600)
    succeeded(again, "the import after the kill")
    baton = hasattr(cpp_extension, "FileBaton")  # torch <= 2.13: its lock blocks while it exists
    assert not baton or "left by a build that was killed" in again.stderr, \
        "the stale lock was not reported"

    from filelock import FileLock
    directory = os.path.dirname(lock)
    os.remove(os.path.join(directory, "day87_ext.so"))
    with FileLock(os.path.join(directory, "op.lock" if baton else "lock")):
        waiting = subprocess.Popen([sys.executable, "-c", "import op"], cwd=folder,
                                   env=environment(cache),
                                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(10)  # far longer than an import that does not wait
        assert waiting.poll() is None \
            and not os.path.exists(os.path.join(directory, "day87_ext.so")), \
            ("a held lock was not waited for: "
             f"{waiting.communicate()[1][-300:] if waiting.poll() else 'built'}")
    assert waiting.wait(timeout=600) == 0, \
        f"the import after the lock was freed: {waiting.communicate()[1][-600:]}"


RETRY = """
import pathlib, torch
binding = pathlib.Path("binding.cpp")
fixed = binding.read_text()
binding.write_text(fixed + "\\n#error a mistake, then its fix\\n")
try:
    import op
except RuntimeError as error:
    print("the first import refused:", "Its first error" in str(error))
binding.write_text(fixed)
import op
a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(4, 5, dtype=torch.float64)
print("the second import:", torch.allclose(op.wmma_mm(a, b), a @ b))
"""


def test_a_build_fixed_in_the_same_process(tmp_path):
    """A notebook: an import whose build fails, the source fixed, the import again in the same
    process, which builds and loads the fixed library (load() names a second build of one
    name in a process "_v1", which is not the file the import loads)."""
    result = import_op(copy_lesson(tmp_path / "retry"), tmp_path / "cache", RETRY)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr.strip()[-600:]}"
    assert result.stdout.splitlines() == ["the first import refused: True",
                                          "the second import: True"], \
        result.stdout + result.stderr[-600:]


RELOAD = """
import importlib, torch
import op
import op
a = torch.randn(3, 4, dtype=torch.float64, requires_grad=True)
b = torch.randn(4, 5, dtype=torch.float64, requires_grad=True)
importlib.reload(op)
importlib.reload(op)
assert torch.allclose(op.wmma_mm(a, b), a @ b)
torch.library.opcheck(torch.ops.day87.wmma_mm.default, (a, b))
assert torch.autograd.gradcheck(op.wmma_mm, (a, b))
if torch.cuda.is_available():
    x = torch.randn(128, 64, dtype=torch.half, device="cuda", requires_grad=True)
    y = torch.randn(64, 256, dtype=torch.half, device="cuda")
    c = op.wmma_mm(x, y)
    assert torch.allclose(c, x.float() @ y.float(), rtol=1e-3, atol=1e-3)
    c.sum().backward()
with open("op.py", "a") as python:  # an edited op.py reloads in place
    python.write("# edited in the notebook\\n")
importlib.reload(op)
assert torch.autograd.gradcheck(op.wmma_mm, (a, b))
with open("kernel.cu", "a") as kernel:
    kernel.write("// edited in the notebook\\n")
try:
    importlib.reload(op)
except RuntimeError as error:
    print(error)
assert torch.allclose(op.wmma_mm(a, b), a @ b)
print("reload ok")
"""


def test_import_twice_and_reload(tmp_path):
    """Import, import, reload, reload: opcheck and gradcheck still pass. A reload
    after an edit says that the process must restart."""
    folder = copy_lesson(tmp_path / "reload")
    result = import_op(folder, tmp_path / "cache", RELOAD)
    assert succeeded(result, "import twice and reload") == "reload ok", "the script did not finish"
    assert "restart the Python process" in result.stdout + result.stderr, \
        "a reload after editing kernel.cu did not say that a restart is needed"


def make_fake_toolkit(home, release):
    """A toolkit that op.py finds (bin/nvcc, include/cuda_runtime.h) and that compiles
    nothing: its nvcc only names its release, and it has no library headers."""
    (home / "bin").mkdir(parents=True)
    (home / "include").mkdir()
    (home / "include" / "cuda_runtime.h").touch()
    nvcc = home / "bin" / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.0'\n")
    nvcc.chmod(0o755)
    return home


@pytest.mark.skipif(not torch.version.cuda, reason="torch has no CUDA: no toolkit is looked for")
def test_toolchain_messages(tmp_path):
    """A mismatched nvcc is refused before compiling; no nvcc builds the CPU part and says so."""
    folder = copy_lesson(tmp_path / "toolchain")
    fake_toolkit = make_fake_toolkit(tmp_path / "fake-cuda", "12.6")
    mismatch = import_op(folder, tmp_path / "mismatch-cache", CUDA_HOME=str(fake_toolkit))
    message = mismatch.stderr
    assert mismatch.returncode != 0 and "12.6" in message and torch.version.cuda in message \
        and "day87: building" not in message, f"mismatched nvcc: {message[-300:]}"
    assert PIP_TOOLKIT_FIX in message, \
        f"the mismatch message names no pip command: {message[-300:]}"

    (tmp_path / "empty-toolkit").mkdir()
    no_toolkit = import_op(folder, tmp_path / "no-nvcc-cache",
                           CUDA_HOME=str(tmp_path / "empty-toolkit"),
                           code="import torch, op; print(op.BUILD['with_cuda'])")
    assert succeeded(no_toolkit, "no nvcc") == "False" \
        and "no CUDA toolkit found" in no_toolkit.stderr, \
        f"missing nvcc: {no_toolkit.stderr[-300:]}"
    assert PIP_TOOLKIT_FIX in no_toolkit.stderr, f"no pip command named: {no_toolkit.stderr[-300:]}"


@pytest.mark.skipif(not torch.version.cuda, reason="torch has no CUDA: no toolkit is looked for")
def test_toolkit_without_library_headers(tmp_path):
    """A toolkit without the headers of cuBLAS, cuSPARSE and cuSOLVER (a minimal one,
    as a student may have) builds the CUDA half: binding.cpp includes none of the
    ATen headers that pull them in."""
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    if not os.path.exists(os.path.join(home, "bin", "nvcc")):
        pytest.skip(f"no CUDA toolkit in {home} to take the minimal one from")
    minimal = tmp_path / "minimal-cuda"
    (minimal / "include").mkdir(parents=True)
    for entry in os.listdir(home):
        if entry != "include":
            os.symlink(os.path.join(home, entry), minimal / entry)
    for entry in os.listdir(os.path.join(home, "include")):
        if not entry.startswith(("cublas", "cusparse", "cusolver")):
            os.symlink(os.path.join(home, "include", entry), minimal / "include" / entry)
    folder = copy_lesson(tmp_path / "minimal")
    result = import_op(folder, tmp_path / "cache", "import op; print(op.BUILD['with_cuda'])",
                       CUDA_HOME=str(minimal))
    assert succeeded(result, "a toolkit without library headers") == "True", result.stderr[-600:]


@pytest.mark.skipif(not os.environ.get("DAY87_PIP_TOOLKIT_PYTHON"),
                    reason="set DAY87_PIP_TOOLKIT_PYTHON to a python whose environment has "
                           "cuda-toolkit[nvcc,cccl] at torch's CUDA version (.ci/run makes one)")
def test_pip_toolkit_alone(tmp_path):
    """With CUDA_HOME unset and no nvcc on PATH, the two commands build the CUDA
    half with the cuda-toolkit wheels of the running environment, and the build
    line names that toolkit."""
    python, env = pip_toolkit_environment(tmp_path / "cache")
    env.pop("TORCH_CUDA_ARCH_LIST", None)  # every architecture
    result = subprocess.run([python, "test_op.py"], cwd=LESSON, env=env, capture_output=True,
                            text=True, timeout=1800)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    built_with = re.search(r"with the toolkit in (\S+)", result.stderr)
    assert built_with and os.path.join("nvidia", "cu") in built_with.group(1), \
        f"not built with the pip toolkit: {result.stderr[-600:]}"
    assert "extension: CUDA + CPU" in result.stdout, result.stdout[:1500]
    row_14 = next((line for line in result.stdout.splitlines() if line.startswith("14 gate.cu ")),
                  "no row 14")
    ran = "run: gate: PASS" if torch.cuda.is_available() else "not run: no GPU visible"
    assert " pass, " in row_14 and "and linked" in row_14 and ran in row_14, row_14


def pip_toolkit_environment(cache):
    """DAY87_PIP_TOOLKIT_PYTHON's environment as the README's route has it: no CUDA_HOME, no nvcc
    on PATH."""
    python = os.environ["DAY87_PIP_TOOLKIT_PYTHON"]
    path = os.pathsep.join([os.path.dirname(python)] + [
        entry for entry in os.environ["PATH"].split(os.pathsep)
        if entry and not os.path.exists(os.path.join(entry, "nvcc"))])
    return python, {name: value for name, value in environment(cache, PATH=path).items()
                    if name not in ("CUDA_HOME", "CUDA_PATH")}


# Row 14's gate with pip's toolkit, as installed and with its static runtime hidden (a copy of
# the toolkit whose lib/ lacks libcudart_static.a): one line each, "how|the row's verdict|what the
# gate said|the libcudart it loaded", the last from the loader's own log (LD_DEBUG), since a
# machine's loader cache may hold another toolkit's libcudart (this one's does).
GATE_WITH_PIP_TOOLKIT = """
import copy, os, re, subprocess, sys, test_op
toolkit = test_op.LESSON.build["toolkit"]
assert toolkit and len(toolkit["include"]) == 1, f"not one pip toolkit: {toolkit}"
home, bare = toolkit["home"], sys.argv[1]
os.makedirs(f"{bare}/lib")
for entry in os.listdir(home):
    if entry != "lib":
        os.symlink(f"{home}/{entry}", f"{bare}/{entry}")
for entry in os.listdir(f"{home}/lib"):
    if entry != "libcudart_static.a":
        os.symlink(f"{home}/lib/{entry}", f"{bare}/lib/{entry}")
no_static = copy.copy(test_op.LESSON)
no_static.build = dict(no_static.build, cuda_home=bare,
                       toolkit=dict(toolkit, home=bare, include=[f"{bare}/include"]))
for how, operator in (("as installed", test_op.LESSON), ("no static runtime", no_static)):
    try:
        verdict = "pass, " + test_op.check_gate(operator)
    except (test_op.Fail, test_op.Skip) as outcome:
        print(how, f"{type(outcome).__name__}, {outcome}".replace("\\n", " "), "", "", sep="|")
        continue
    gate, _ = test_op.build_gate(operator, f"{operator.build['cuda_home']}/bin/nvcc", "sm_75")
    ran = subprocess.run([gate], capture_output=True, text=True,
                         env=dict(os.environ, LD_DEBUG="libs"))  # the loader says what it loads
    said = [line for line in (ran.stdout + ran.stderr).splitlines() if line.startswith("gate")]
    loaded = re.findall(r"calling init: (\\S*libcudart\\S*)", ran.stderr) or ["none"]
    print(how, verdict, said[-1] if said else f"exit {ran.returncode}", loaded[0], sep="|")
"""


@pytest.mark.skipif(not os.environ.get("DAY87_PIP_TOOLKIT_PYTHON"),
                    reason="set DAY87_PIP_TOOLKIT_PYTHON to a python whose environment has "
                           "cuda-toolkit[nvcc,cccl] at torch's CUDA version (.ci/run makes one)")
def test_gate_links_with_the_pip_toolkit(tmp_path):
    """Row 14 links gate.cu with pip's toolkit alone, no GPU needed: its static runtime from
    the wheel's lib/, where nvcc does not look by itself; and, where a toolkit has no static
    runtime, the shared one, found through an rpath to the wheel's folder. Either gate then
    runs, and says there is no CUDA device (or, on a GPU, passes)."""
    python, env = pip_toolkit_environment(tmp_path / "cache")
    result = subprocess.run([python, "-c", GATE_WITH_PIP_TOOLKIT, str(tmp_path / "bare-toolkit")],
                            cwd=LESSON, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-1500:] + result.stderr[-1500:]
    lines = dict(line.split("|", 1) for line in result.stdout.splitlines() if "|" in line)
    ran = "gate: PASS" if torch.cuda.is_available() else "no CUDA device to run on"
    pip_folder = os.path.join("nvidia", "cu")
    for how, runtime in (("as installed", "CUDA runtime"),
                         ("no static runtime", "shared CUDA runtime, by rpath")):
        verdict, said, loaded = lines[how].split("|")
        assert verdict.startswith("pass, ") and "and linked" in verdict and runtime in verdict, \
            f"{how}: {verdict}"
        assert ran in said, f"{how}: the gate, run: {said}"
        if how == "no static runtime":
            assert pip_folder in loaded, f"{how}: the gate loaded {loaded}, not the wheel's"


def test_missing_ninja_and_unwritable_cache(tmp_path):
    folder = copy_lesson(tmp_path / "toolchain")
    path_without_ninja = os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not os.path.exists(os.path.join(entry, "ninja")))
    no_ninja = import_op(folder, tmp_path / "no-ninja-cache", PATH=path_without_ninja)
    assert no_ninja.returncode != 0 and "pip install ninja" in no_ninja.stderr, \
        f"missing ninja: {no_ninja.stderr[-300:]}"

    (tmp_path / "a-file").touch()
    unwritable = import_op(folder, tmp_path / "a-file" / "cache")
    assert unwritable.returncode != 0 and "TORCH_EXTENSIONS_DIR" in unwritable.stderr \
        and "cannot write the build cache" in unwritable.stderr, \
        f"unwritable cache: {unwritable.stderr[-300:]}"


def test_notebook(tmp_path):
    """A real Jupyter kernel, started in another folder: the build line shows in
    the cell's output and the result is right."""
    nbclient = pytest.importorskip("nbclient", reason="test-only: pip install nbclient ipykernel")
    import nbformat

    cells = [f"import sys\nsys.path.insert(0, {LESSON!r})\nimport op",
             "import torch\na = torch.randn(3, 4, dtype=torch.float64)\n"
             "b = torch.randn(4, 5, dtype=torch.float64)\n"
             "print('result matches:', torch.allclose(op.wmma_mm(a, b), a @ b))"]
    notebook = nbformat.v4.new_notebook(
        cells=[nbformat.v4.new_code_cell(source) for source in cells])
    elsewhere = tmp_path / "notebook-cwd"
    elsewhere.mkdir()
    saved = dict(os.environ)
    os.environ.update(environment(tmp_path / "cache"))
    try:
        nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": str(elsewhere)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    text = "".join(output.get("text", "") for cell in notebook.cells
                   for output in cell.get("outputs", []))
    assert "day87: building" in text, f"the build notice is not in the cell output: {text[:300]}"
    assert "result matches: True" in text, f"the call's result is wrong or missing: {text[-300:]}"


TWO_COPIES = """
import importlib.util, sys
def load(name, folder):
    spec = importlib.util.spec_from_file_location(name, folder + "/op.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
first = load("op_first", sys.argv[1])
try:
    second = load("op_second", sys.argv[2])
    print("second loaded:", second.BUILD["library"] == first.BUILD["library"])
except RuntimeError as error:
    print("refused:", error)
"""


def test_two_copies_in_one_process(tmp_path):
    """A notebook that imports day87's and day88's op.py: identical sources share
    one library silently; different sources are refused, naming the op.py that
    serves day87 and the one being imported, not the folder that happened to
    build the cached library first (a third copy, here)."""
    cache = tmp_path / "cache"
    original, same = copy_lesson(tmp_path / "day87"), copy_lesson(tmp_path / "day87-copy")
    first_builder = copy_lesson(tmp_path / "day87-first-builder")
    succeeded(import_op(first_builder, cache), "the first build")
    edited_binding, edited_python = copy_lesson(tmp_path / "day88"), copy_lesson(tmp_path / "day89")
    with open(os.path.join(edited_binding, "binding.cpp"), "a") as binding:
        binding.write("\n// the next lesson's change\n")
    with open(os.path.join(edited_python, "op.py"), "a") as python:
        python.write("\n# the next lesson's change\n")
    for other, expected in ((same, "second loaded: True"), (edited_binding, "refused:"),
                            (edited_python, "refused:")):
        result = subprocess.run([sys.executable, "-c", TWO_COPIES, original, other],
                                env=environment(cache), capture_output=True, text=True, timeout=900)
        assert result.returncode == 0, result.stderr[-600:]
        assert result.stdout.startswith(expected), f"{other}: {result.stdout[-600:]}"
        if expected == "refused:":
            assert original in result.stdout and other in result.stdout \
                and "restart" in result.stdout, \
                result.stdout
            assert first_builder not in result.stdout, result.stdout


def test_shared_cache_never_loads_a_planted_library(tmp_path):
    """A build folder that another user owns, or that others can write, is never
    loaded: the import refuses and names the folder and the fix."""
    folder, cache = copy_lesson(tmp_path / "lesson"), tmp_path / "cache"
    directory = succeeded(import_op(folder, cache), "a first build")
    assert oct(os.stat(directory).st_mode & 0o777) == "0o700", "the build folder is not private"
    code = "import op; print('loaded')"
    os.chmod(directory, 0o777)  # anyone may write into it
    refused = import_op(folder, cache, code)
    assert refused.returncode != 0 and "refusing to load" in refused.stderr \
        and directory in refused.stderr, \
        refused.stderr[-400:]
    os.chmod(directory, 0o700)
    if os.getuid() == 0:  # root can hand the library to another user, as a planted one would be
        library = os.path.join(directory, "day87_ext.so")
        os.chown(library, 12345, 12345)
        refused = import_op(folder, cache, code)
        assert refused.returncode != 0 and "belongs to user 12345" in refused.stderr, \
            refused.stderr[-400:]
        os.chown(library, 0, 0)
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)  # world-writable, no sticky bit: others could swap the build folder
    refused = import_op(folder, shared, code)
    assert refused.returncode != 0 and "not sticky" in refused.stderr, refused.stderr[-400:]
    assert succeeded(import_op(folder, cache, code), "the private folder again") == "loaded"


def test_damaged_library(tmp_path):
    """A library that exists but will not load: the message says which folder to delete."""
    folder, cache = copy_lesson(tmp_path / "lesson"), tmp_path / "cache"
    directory = succeeded(import_op(folder, cache), "a first build")
    with open(os.path.join(directory, "day87_ext.so"), "r+b") as library:
        library.truncate(100)
    damaged = import_op(folder, cache)
    assert damaged.returncode != 0 and f"delete {directory}" in damaged.stderr, \
        damaged.stderr[-400:]


STALE_BACKWARD = """
import test_op, torch, op
a = torch.randn(4, 3, dtype=torch.float64, requires_grad=True)
b = torch.randn(3, 5, dtype=torch.float64)
with test_op.without_autograd_cache():  # as the harness's compile rows compile
    torch.compile(lambda a, b: op.wmma_mm(a, b).sum())(a, b).backward()
print(torch.allclose(a.grad, torch.ones(4, 5, dtype=torch.float64) @ b.t()))
"""


def test_compiled_backward_is_the_current_one(tmp_path):
    """An edited _backward is the one torch.compile runs under the harness's switch
    (test_op.without_autograd_cache, which the compile rows use), whatever inductor's
    on-disk autograd cache compiled before the edit."""
    folder = copy_lesson(tmp_path / "lesson")
    shutil.copy2(os.path.join(LESSON, "test_op.py"), folder)
    cache, inductor_cache = tmp_path / "cache", str(tmp_path / "inductor-cache")
    op_py = os.path.join(folder, "op.py")
    original = open(op_py).read()
    halved = original.replace("grad_a = torch.matmul(grad, wide_b).to(b.dtype)",
                              "grad_a = 0.5 * torch.matmul(grad, wide_b).to(b.dtype)")
    assert halved != original
    with open(op_py, "w") as source:
        source.write(halved)
    first = import_op(folder, cache, STALE_BACKWARD, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    assert succeeded(first, "the halved backward") == "False", "the halved backward went unnoticed"
    with open(op_py, "w") as source:
        source.write(original)
    second = import_op(folder, cache, STALE_BACKWARD, TORCHINDUCTOR_CACHE_DIR=inductor_cache)
    assert succeeded(second, "the restored backward") == "True", "a stale compiled backward ran"


# binding.cpp's messages stream sizes, strides and dtypes into TORCH_CHECK, as the lesson prints
# the idiom. Through a library with its own copy of libstdc++ (the H200 image's compiler links
# one), a streamed number crashes the interpreter or drops its value (checks/NOTES.md).
STREAMED_VALUES = """
import torch, op
f64 = torch.float64
for a, b, value in ((torch.randn(4, 3, dtype=f64), torch.randn(7, 5, dtype=f64), \
"b: [7, 5] Double on cpu"),
                    (torch.randn(4, 3, dtype=f64), torch.randn(5, 3, dtype=f64).t(), \
"with strides [1, 3]")):
    try:
        op.wmma_mm(a, b)
        print("returned without raising")
    except RuntimeError as error:
        print("raised" if value in str(error) else "raised without its values: " \
+ str(error).splitlines()[0])
print("needs libstdc++.so.6:", "libstdc++.so.6" in op.needed_libraries(op.BUILD["library"]))
"""
RAISED = ["raised", "raised", "needs libstdc++.so.6: True"]


def test_torch_check_streams_values(tmp_path):
    """binding.cpp's TORCH_CHECKs raise RuntimeError with their values in a fresh process, with
    the environment's compiler, and do not kill the interpreter: the library needs \
libstdc++.so.6."""
    result = import_op(copy_lesson(tmp_path / "lesson"), tmp_path / "cache", STREAMED_VALUES)
    assert result.returncode == 0, f"exit {result.returncode}: {result.stderr.strip()[-600:]}"
    assert result.stdout.splitlines() == RAISED, result.stdout


def test_compiler_that_links_libstdcxx_statically(tmp_path):
    """A CXX that adds -static-libstdc++, as the H200 image's does: op.py's probe sees it, and
    either refuses, naming the fix, or says how it builds a library that needs libstdc++.so.6."""
    compiler = shutil.which("g++")
    if not compiler:
        pytest.skip("no g++ to wrap")
    wrapper = tmp_path / "static-g++"
    wrapper.write_text(f'#!/bin/sh\nexec {compiler} "$@" -static-libstdc++\n')
    wrapper.chmod(0o755)
    result = import_op(copy_lesson(tmp_path / "lesson"), tmp_path / "cache", STREAMED_VALUES,
                       CXX=str(wrapper))
    if result.returncode != 0:
        assert "links libstdc++ statically" in result.stderr and "Fix: CXX=" in result.stderr, \
            f"exit {result.returncode}: {result.stderr.strip()[-600:]}"
    else:
        assert f"{wrapper} links libstdc++ statically" in result.stderr, result.stderr[-600:]
        assert result.stdout.splitlines() == RAISED, result.stdout
