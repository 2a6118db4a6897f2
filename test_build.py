"""test_build.py: the build and the import, on the machines students really have.

    python test_build.py          # every check (CI runs this, without a GPU)
    python test_build.py --gpu    # on a GPU machine: keyed builds, concurrent first
                                  # import and reload, with the card's architecture

Each check runs `import op` in fresh processes, against a fresh build cache and,
where it edits sources, a copy of this folder, so the repository and the user's
cache are never touched. The table and the last line follow test_op.py.
Without --gpu, builds target sm_75 alone to keep CI short; test_op.py's run in CI
builds the full architecture list.
"""

import argparse
import fcntl
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from table import Skip, require, run_table

HERE = os.path.dirname(os.path.abspath(__file__))
FOLDER_FILES = ("kernel.cu", "binding.cpp", "op.py")
WORKSPACE = tempfile.mkdtemp(prefix="day87-build-checks-")
GPU = "--gpu" in sys.argv


def fresh_dir(name):
    path = os.path.join(WORKSPACE, name)
    os.makedirs(path)
    return path


def copy_folder(name):
    """A copy of the lesson folder, as the next lesson would make it."""
    target = fresh_dir(name)
    for file in FOLDER_FILES:
        shutil.copy2(os.path.join(HERE, file), target)
    return target


def environment(cache, **extra):
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=cache, PYTHONUNBUFFERED="1")
    if not GPU:
        env["TORCH_CUDA_ARCH_LIST"] = "7.5"  # one architecture: a short build
    env.update(extra)
    return env


PRINT_BUILD = "import op; print(op.BUILD['directory'])"


def import_op(folder, cache, code=PRINT_BUILD, timeout=900, **extra):
    return subprocess.run([sys.executable, "-c", code], cwd=folder, env=environment(cache, **extra),
                          capture_output=True, text=True, timeout=timeout)


def built(result):
    return "day87: building" in result.stderr


def succeeded(result, what):
    require(result.returncode == 0, f"{what}: exit {result.returncode}: {result.stderr.strip()[-600:]}")
    return result.stdout.strip().splitlines()[-1]


def library_state(directory):
    """mtimes of what a compiler run or a cpp_extension.load() would rewrite."""
    return {name: os.stat(os.path.join(directory, name)).st_mtime_ns
            for name in ("day87_ext.so", "build.ninja") if os.path.exists(os.path.join(directory, name))}


# ---------------------------------------------------------------------------
# 1. Keyed builds
# ---------------------------------------------------------------------------
def check_keyed_builds():
    import unittest.mock

    import torch

    # The key itself: op.build_plan() under changed inputs. Importing op here
    # builds once, into this check's own cache.
    os.environ.update(environment(fresh_dir("key-cache")))
    sys.path.insert(0, HERE)
    import op
    plan = op.build_plan

    def directory(**changes):
        with unittest.mock.patch.dict(os.environ, changes.get("env", {})):
            with unittest.mock.patch.object(torch, "__version__", changes.get("torch", torch.__version__)):
                with unittest.mock.patch.object(torch.version, "cuda", changes.get("cuda", torch.version.cuda)):
                    return plan()["directory"]

    base = directory(env={"TORCH_CUDA_ARCH_LIST": "8.0"})
    variants = {"another torch version": directory(env={"TORCH_CUDA_ARCH_LIST": "8.0"}, torch="0.0.1"),
                "another architecture list": directory(env={"TORCH_CUDA_ARCH_LIST": "9.0"})}
    if torch.version.cuda:
        variants["another CUDA build"] = directory(env={"TORCH_CUDA_ARCH_LIST": "8.0"}, cuda="99.0")
    for what, other in variants.items():
        require(other != base, f"{what} maps to the same build directory {base}")

    folder, cache = copy_folder("keyed"), fresh_dir("keyed-cache")
    first = import_op(folder, cache)
    directory_first = succeeded(first, "cold import")
    require(built(first), "the cold import did not announce a build")
    before = library_state(directory_first)
    second = import_op(folder, cache)
    require(succeeded(second, "warm import") == directory_first, "the warm import chose another directory")
    require(not built(second) and second.stderr.strip() == "",
            f"the warm import printed: {second.stderr.strip()[:300]}")
    require(library_state(directory_first) == before, "the warm import rewrote the library or build.ninja")
    with open(os.path.join(folder, "kernel.cu"), "a") as kernel:
        kernel.write("\n// an edit\n")
    third = import_op(folder, cache)
    require(built(third) and succeeded(third, "import after an edit") != directory_first,
            "editing kernel.cu did not rebuild into a new directory")
    return (f"{len(variants)} changes give new directories; warm import runs no compiler; "
            "an edited kernel.cu rebuilds")


# ---------------------------------------------------------------------------
# 2. Copies of the folder
# ---------------------------------------------------------------------------
def check_copies():
    cache = fresh_dir("copies-cache")
    original, edited = copy_folder("original"), copy_folder("next-lesson")
    with open(os.path.join(edited, "binding.cpp"), "a") as binding:
        binding.write("\n// the next lesson's change\n")
    first = succeeded(import_op(original, cache), "original")
    before = library_state(first)
    second = succeeded(import_op(edited, cache), "edited copy")
    require(first != second, "the edited copy reused the original's build directory")
    require(library_state(first) == before, "building the copy touched the original's library")
    check = ("import torch, op; a = torch.randn(3, 4, dtype=torch.float64); "
             "b = torch.randn(4, 5, dtype=torch.float64); "
             "print(torch.allclose(op.wmma_mm(a, b), a @ b))")
    for folder in (original, edited):
        require(succeeded(import_op(folder, cache, check), folder) == "True", f"wrong result from {folder}")
    return "the edited copy builds its own library; both run"


# ---------------------------------------------------------------------------
# 3. Concurrent first import
# ---------------------------------------------------------------------------
def check_concurrent_import():
    folder, cache = copy_folder("concurrent"), fresh_dir("concurrent-cache")
    processes = [subprocess.Popen([sys.executable, "-c", PRINT_BUILD], cwd=folder, env=environment(cache),
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                 for _ in range(2)]
    results = [process.communicate(timeout=900) for process in processes]
    for process, (_, stderr) in zip(processes, results):
        require(process.returncode == 0, f"an import failed: {stderr.strip()[-400:]}")
    builders = sum("day87: building" in stderr for _, stderr in results)
    require(builders == 1, f"{builders} processes compiled, expected exactly 1")
    return "both succeed, one compiles, the other waits and loads its build"


# ---------------------------------------------------------------------------
# 4. A killed build
# ---------------------------------------------------------------------------
def check_killed_build():
    folder, cache = copy_folder("killed"), fresh_dir("killed-cache")
    process = subprocess.Popen([sys.executable, "-c", "import op"], cwd=folder, env=environment(cache),
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    deadline, lock = time.monotonic() + 120, None
    while time.monotonic() < deadline and lock is None:
        for entry in os.listdir(cache):
            if os.path.exists(os.path.join(cache, entry, "lock")):
                lock = os.path.join(cache, entry, "lock")
        time.sleep(0.05)
    require(lock is not None, "the build never created cpp_extension's lock file")
    time.sleep(1.0)  # let ninja start the compilers
    os.killpg(process.pid, signal.SIGKILL)  # the import, ninja and the compilers
    process.wait()
    require(os.path.exists(lock), "the kill left no lock file: nothing to recover from")
    start = time.monotonic()
    again = import_op(folder, cache, timeout=600)
    succeeded(again, "the import after the kill")
    require("left by a build that was killed" in again.stderr, "the stale lock was not reported")

    # And a live build that never ends: the wait is bounded, and the message says what to do.
    holder = open(os.path.join(os.path.dirname(lock), "op.lock"), "w")
    fcntl.flock(holder, fcntl.LOCK_EX)
    os.remove(os.path.join(os.path.dirname(lock), "build-complete"))
    try:
        blocked = import_op(folder, cache, timeout=60, DAY87_BUILD_LOCK_TIMEOUT_S="3")
    finally:
        holder.close()
    require(blocked.returncode != 0 and "op.lock" in blocked.stderr and "delete that file" in blocked.stderr,
            f"a held lock did not give a bounded, named failure: {blocked.stderr.strip()[-300:]}")
    return f"recovered in {time.monotonic() - start:.0f} s; a held lock fails after 3 s, naming the file"


# ---------------------------------------------------------------------------
# 5. Import twice, reload
# ---------------------------------------------------------------------------
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
if {gpu}:
    x = torch.randn(128, 64, dtype=torch.half, device="cuda", requires_grad=True)
    y = torch.randn(64, 256, dtype=torch.half, device="cuda")
    c = op.wmma_mm(x, y)
    assert torch.allclose(c, x.float() @ y.float(), rtol=1e-3, atol=1e-3)
    c.sum().backward()
with open("kernel.cu", "a") as kernel:
    kernel.write("// edited in the notebook\\n")
importlib.reload(op)
assert torch.allclose(op.wmma_mm(a, b), a @ b)
print("reload ok")
"""


def check_reload():
    folder, cache = copy_folder("reload"), fresh_dir("reload-cache")
    result = import_op(folder, cache, RELOAD.format(gpu=GPU))
    require(succeeded(result, "import twice and reload") == "reload ok", "the script did not finish")
    require("restart the Python process" in result.stderr,
            "a reload after editing kernel.cu did not say that a restart is needed")
    return "import twice, reload twice, then opcheck and gradcheck pass; an edit asks for a restart"


# ---------------------------------------------------------------------------
# 6. Toolchain problems, each with a clear message
# ---------------------------------------------------------------------------
def check_toolchain_messages():
    import torch

    folder = copy_folder("toolchain")
    report = []
    if torch.version.cuda:
        fake_toolkit = fresh_dir("fake-cuda")
        os.makedirs(os.path.join(fake_toolkit, "bin"))
        os.makedirs(os.path.join(fake_toolkit, "include"))
        open(os.path.join(fake_toolkit, "include", "cuda_runtime.h"), "w").close()
        nvcc = os.path.join(fake_toolkit, "bin", "nvcc")
        with open(nvcc, "w") as script:
            script.write("#!/bin/sh\necho 'Cuda compilation tools, release 12.6, V12.6.85'\n")
        os.chmod(nvcc, 0o755)
        mismatch = import_op(folder, fresh_dir("mismatch-cache"), CUDA_HOME=fake_toolkit)
        message = mismatch.stderr
        require(mismatch.returncode != 0 and "12.6" in message and torch.version.cuda in message
                and "Fix" in message and "day87: building" not in message,
                f"mismatched nvcc: {message.strip()[-300:]}")
        report.append("nvcc 12.6 vs torch refused before compiling")

        no_toolkit = import_op(folder, fresh_dir("no-nvcc-cache"), CUDA_HOME=fresh_dir("empty-toolkit"),
                               code="import torch, op; print(op.BUILD['with_cuda'])")
        require(succeeded(no_toolkit, "no nvcc") == "False" and "no CUDA toolkit found" in no_toolkit.stderr,
                f"missing nvcc: {no_toolkit.stderr.strip()[-300:]}")
        report.append("no nvcc: CPU part built, said once")

    path_without_ninja = os.pathsep.join(
        entry for entry in os.environ.get("PATH", "").split(os.pathsep)
        if entry and not os.path.exists(os.path.join(entry, "ninja")))
    no_ninja = import_op(folder, fresh_dir("no-ninja-cache"), PATH=path_without_ninja)
    require(no_ninja.returncode != 0 and "pip install ninja" in no_ninja.stderr,
            f"missing ninja: {no_ninja.stderr.strip()[-300:]}")
    report.append("no ninja: named")

    a_file = os.path.join(WORKSPACE, "a-file")
    open(a_file, "w").close()
    unwritable = import_op(folder, os.path.join(a_file, "cache"))
    require(unwritable.returncode != 0 and "TORCH_EXTENSIONS_DIR" in unwritable.stderr
            and "cannot write the build cache" in unwritable.stderr,
            f"unwritable cache: {unwritable.stderr.strip()[-300:]}")
    report.append("unwritable cache: named")
    return "; ".join(report)


# ---------------------------------------------------------------------------
# 8. A real Jupyter kernel
# ---------------------------------------------------------------------------
def check_notebook():
    try:
        import nbclient
        import nbformat
    except ImportError:
        raise Skip("needs nbclient and ipykernel (pip install nbclient ipykernel; test-only)") from None
    cell_sources = [
        f"import sys\nsys.path.insert(0, {HERE!r})\nimport op",
        "import torch\na = torch.randn(3, 4, dtype=torch.float64)\nb = torch.randn(4, 5, dtype=torch.float64)\n"
        "print('result matches:', torch.allclose(op.wmma_mm(a, b), a @ b))",
    ]
    notebook = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(s) for s in cell_sources])
    elsewhere = fresh_dir("notebook-cwd")  # the kernel starts away from this folder
    saved = dict(os.environ)
    os.environ.update(environment(fresh_dir("notebook-cache")))
    try:
        nbclient.NotebookClient(notebook, timeout=900, kernel_name="python3",
                                resources={"metadata": {"path": elsewhere}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    outputs = [output.get("text", "") for cell in notebook.cells for output in cell.get("outputs", [])]
    text = "".join(outputs)
    require("day87: building" in text, f"the build notice is not in the cell output: {text[:300]}")
    require("result matches: True" in text, f"the call's result is wrong or missing: {text[-300:]}")
    return "build notice shown in the cell, result right, kernel started elsewhere"


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpu", action="store_true", help="the subset that ran on the H200: 1, 3 and 5")
    parser.parse_args()
    checks = [
        ("1 keyed builds", "new key, same tree, edited source", check_keyed_builds),
        ("2 copies of the folder", "an edited copy beside the original", check_copies),
        ("3 concurrent first import", "two processes, one cold cache", check_concurrent_import),
        ("4 a killed build", "SIGKILL mid-build, then a held lock", check_killed_build),
        ("5 import twice, reload", "import, import, reload, edit, reload", check_reload),
        ("6 toolchain messages", "wrong nvcc, no nvcc, no ninja, no cache", check_toolchain_messages),
        ("8 notebook", "a real Jupyter kernel, another cwd", check_notebook),
    ]
    if GPU:
        checks = [check for check in checks if check[0][0] in "135"]
    ok = run_table(checks)
    shutil.rmtree(WORKSPACE, ignore_errors=True)
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
