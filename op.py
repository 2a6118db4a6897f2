"""op.py: day87::wmma_mm, built at import, with its fake and autograd registrations.

    import op
    c = op.wmma_mm(a, b)            # a (M x K), b (K x N): float16 on CUDA, float64 on CPU

The first import compiles kernel.cu and binding.cpp with torch.utils.cpp_extension
(tens of seconds, announced by one line); later imports load the cached library
without running a compiler. From the command line:

    python op.py --bench            # wmma_mm against cuBLAS, side by side (needs a GPU)
    python op.py --build-times      # cold build and warm import times

The build directory is named by a hash of everything the library depends on: the
sources, the torch version and its CUDA build, the architectures and the Python
version. A second torch, a second card or an edited kernel.cu never loads a stale
library; it gets a directory of its own.
"""

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXTENSION_NAME = "day87_ext"
CUDA_SOURCES = ("kernel.cu", "binding.cpp")
CPU_SOURCES = ("binding.cpp",)
# Built when torch has CUDA but no card is visible (CI, a login node): every
# architecture from the T4 up, with PTX for the last so that newer cards JIT it.
# nvcc 13 no longer targets anything older than 7.5.
ARCHS_WITHOUT_A_CARD = "7.5;8.0;8.6;8.9;9.0+PTX"
# A concurrent first import waits for the build in progress at most this long.
BUILD_LOCK_TIMEOUT_S = float(os.environ.get("DAY87_BUILD_LOCK_TIMEOUT_S", "900"))


def _say(message):
    # stderr, flushed: visible in a terminal, in a notebook cell and in CI logs.
    print(f"day87: {message}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------
# What to build, and where
# ---------------------------------------------------------------------------
def find_cuda_home():
    """The CUDA toolkit to build with, or None. CUDA_HOME (or CUDA_PATH), where set,
    is the only candidate: a user who names a toolkit means that one. Otherwise
    the nvcc on PATH, but only where its folder has the headers (a wrapper script
    in /usr/local/bin would make the toolkit /usr/local), then /usr/local/cuda."""
    chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if chosen:
        candidates = [chosen]
    else:
        nvcc_on_path = shutil.which("nvcc")
        candidates = [os.path.dirname(os.path.dirname(os.path.realpath(nvcc_on_path)))
                      if nvcc_on_path else None, "/usr/local/cuda"]
    for home in filter(None, candidates):
        if os.path.exists(os.path.join(home, "bin", "nvcc")) and os.path.exists(
            os.path.join(home, "include", "cuda_runtime.h")
        ):
            return home
    return None


def nvcc_version_text(cuda_home):
    """The literal output of `nvcc --version`."""
    return subprocess.run(
        [os.path.join(cuda_home, "bin", "nvcc"), "--version"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()


def architecture_list():
    """The architectures to build for, as TORCH_CUDA_ARCH_LIST spells them."""
    chosen = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if chosen:
        return chosen
    if torch.cuda.is_available():
        capabilities = sorted({torch.cuda.get_device_capability(i)
                               for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in capabilities) + "+PTX"
    return ARCHS_WITHOUT_A_CARD


def build_plan():
    """Everything the build depends on, and the directory that hash names."""
    cuda_home = find_cuda_home() if torch.version.cuda else None
    with_cuda = cuda_home is not None
    sources = CUDA_SOURCES if with_cuda else CPU_SOURCES
    archs = architecture_list() if with_cuda else None
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(HERE, name), "rb") as source:
            digest.update(name.encode() + b"\0" + source.read() + b"\0")
    for part in (torch.__version__, torch.version.cuda, archs, sys.version, sys.platform):
        digest.update(str(part).encode() + b"\0")
    key = digest.hexdigest()[:16]
    cache_root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions")
    return {
        "with_cuda": with_cuda,
        "cuda_home": cuda_home,
        "sources": sources,
        "archs": archs,
        "key": key,
        "directory": os.path.join(cache_root, f"day87-{key}"),
    }


# ---------------------------------------------------------------------------
# Building
# ---------------------------------------------------------------------------
def _library_path(plan):
    return os.path.join(plan["directory"], f"{EXTENSION_NAME}.so")


def _done_marker(plan):
    # Written only after a build succeeded: a library that a killed link left
    # half-written has no marker and is rebuilt, never loaded.
    return os.path.join(plan["directory"], "build-complete")


def _check_toolchain(plan):
    """Refuse, before compiling, what would fail late or load wrong."""
    if shutil.which("ninja") is None:
        raise RuntimeError("day87: building the extension needs ninja, and none is on PATH. "
                           "Fix: pip install ninja (it is in requirements.txt).")
    if not plan["with_cuda"]:
        return
    text = nvcc_version_text(plan["cuda_home"])
    found = re.search(r"release (\d+)\.(\d+)", text)
    nvcc_major = found.group(1) if found else "unknown"
    torch_major = torch.version.cuda.split(".")[0]
    if nvcc_major != torch_major:
        raise RuntimeError(
            f"day87: nvcc in {plan['cuda_home']} is CUDA {found.group(0) if found else text!r}, "
            f"but torch {torch.__version__} was built with CUDA {torch.version.cuda}. Their "
            "major versions must match: an extension built by one cannot load beside the "
            f"other. Fix: install a torch built for CUDA {nvcc_major}.x (the cu{nvcc_major}* "
            f"index at https://download.pytorch.org/whl/), or set CUDA_HOME to a CUDA "
            f"{torch_major}.x toolkit.")


def _acquire_build_lock(plan):
    """An exclusive lock on the build directory. flock, not a lock file: the kernel
    releases it when its holder dies, so a killed build never blocks the next one."""
    path = os.path.join(plan["directory"], "op.lock")
    handle = open(path, "w")
    deadline = time.monotonic() + BUILD_LOCK_TIMEOUT_S
    announced = False
    while True:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return handle
        except BlockingIOError:
            if not announced:
                _say(f"another process is building in {plan['directory']}; waiting for it")
                announced = True
            if time.monotonic() > deadline:
                handle.close()
                raise RuntimeError(
                    f"day87: waited {BUILD_LOCK_TIMEOUT_S:.0f} s for the process that holds "
                    f"{path} to finish its build. If no other Python process is building "
                    "day87, delete that file and import again; DAY87_BUILD_LOCK_TIMEOUT_S "
                    "sets the wait.") from None
            time.sleep(0.2)


def _build(plan):
    """Compile and link into plan['directory'], one process at a time."""
    try:
        os.makedirs(plan["directory"], exist_ok=True)
        lock = _acquire_build_lock(plan)
    except OSError as error:
        raise RuntimeError(
            f"day87: cannot write the build cache {plan['directory']}: {error}. "
            "Set TORCH_EXTENSIONS_DIR to a writable folder.") from None
    with lock:
        if os.path.exists(_done_marker(plan)):
            return  # the process we waited for built it
        _check_toolchain(plan)
        # We hold the flock, so no live op.py is building here: a cpp_extension
        # lock file that is left over belongs to a killed build, and so does any
        # library without the done marker.
        stale_lock = os.path.join(plan["directory"], "lock")
        if os.path.exists(stale_lock):
            _say(f"removing {stale_lock}, left by a build that was killed")
            os.remove(stale_lock)
        if os.path.exists(_library_path(plan)):
            os.remove(_library_path(plan))
        what = (f"for sm {plan['archs']}" if plan["with_cuda"]
                else "CPU part only (" + ("torch has no CUDA" if not torch.version.cuda
                                          else "no nvcc found: set CUDA_HOME") + ")")
        _say(f"building the extension {what} in {plan['directory']}; "
             "a first build takes tens of seconds")
        # cpp_extension reads the toolkit and the architectures from the
        # environment; set them for this build only.
        saved = {name: os.environ.get(name) for name in ("CUDA_HOME", "TORCH_CUDA_ARCH_LIST")}
        if plan["with_cuda"]:
            os.environ["CUDA_HOME"] = plan["cuda_home"]
            os.environ["TORCH_CUDA_ARCH_LIST"] = plan["archs"]
        try:
            # Its import warns "No CUDA runtime is found" wherever no GPU is
            # visible, which is expected in CI; the line above says what is built.
            logger = logging.getLogger("torch.utils.cpp_extension")
            level = logger.level
            logger.setLevel(logging.ERROR)
            from torch.utils import cpp_extension
            logger.setLevel(level)
            if plan["with_cuda"]:
                cpp_extension.CUDA_HOME = plan["cuda_home"]  # read once, at its import
            cpp_extension.load(
                name=EXTENSION_NAME,
                sources=[os.path.join(HERE, name) for name in plan["sources"]],
                extra_cflags=["-O2"] + (["-DDAY87_WITH_CUDA"] if plan["with_cuda"] else []),
                # -lineinfo lets compute-sanitizer name kernel.cu's lines; no cost at run time.
                extra_cuda_cflags=["-O3", "-lineinfo"],
                build_directory=plan["directory"],
                is_python_module=False,
            )
        finally:
            for name, value in saved.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
        with open(_done_marker(plan), "w") as marker:
            marker.write(plan["key"] + "\n")


def _load():
    """Load the library once per process; build it first where needed."""
    plan = build_plan()
    if hasattr(torch.ops.day87, "wmma_mm"):
        # Already loaded: a reload, or a second import. Loading another build
        # would register the day87 namespace twice, which aborts the process.
        loaded = globals().get("BUILD")
        if loaded is not None and loaded["key"] != plan["key"]:
            _say("kernel.cu or binding.cpp changed since this process loaded day87; "
                 "restart the Python process (the notebook kernel) to load the new build")
            return loaded
        return plan
    if torch.version.cuda and not plan["with_cuda"]:
        where = (f"CUDA_HOME={os.environ.get('CUDA_HOME') or os.environ.get('CUDA_PATH')} has no "
                 "bin/nvcc and include/cuda_runtime.h"
                 if os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
                 else "no nvcc on PATH and no /usr/local/cuda")
        _say(f"no CUDA toolkit found ({where}): only the CPU implementation is registered, "
             f"and calls on CUDA tensors will fail. Install the CUDA {torch.version.cuda} "
             "toolkit and set CUDA_HOME to build the kernel.")
    if not os.path.exists(_done_marker(plan)):
        _build(plan)
    torch.ops.load_library(_library_path(plan))
    return plan


BUILD = _load()


# ---------------------------------------------------------------------------
# The Python registrations: fake and autograd
# ---------------------------------------------------------------------------
def accumulate_dtype(input_dtype):
    """The output dtype for an input dtype: FP16 accumulates and is stored in FP32,
    the float64 reference path stays in float64."""
    widened = {torch.float16: torch.float32, torch.float64: torch.float64}
    if input_dtype not in widened:
        raise TypeError(f"day87::wmma_mm: rule 'dtype': inputs must be float16 (CUDA) or "
                        f"float64 (CPU), got {input_dtype}")
    return widened[input_dtype]


def _fake(a, b):
    # Shapes and dtypes only: a fake tensor has no data to read. This is what lets
    # torch.compile plan around the operator instead of breaking the graph there.
    torch._check(a.dim() == 2 and b.dim() == 2)
    torch._check(a.shape[1] == b.shape[0])
    torch._check(a.dtype == b.dtype)
    torch._check(a.device == b.device)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=accumulate_dtype(a.dtype))


def _setup_context(ctx, inputs, output):
    a, b = inputs
    # Save each input only when its partner needs a gradient: grad_a needs b and
    # grad_b needs a. No copy is made; autograd keeps a reference.
    ctx.save_for_backward(b if ctx.needs_input_grad[0] else None,
                          a if ctx.needs_input_grad[1] else None)


def _backward(ctx, grad):
    # c[i][j] = sum_p a[i][p] b[p][j], so dL/da = grad @ b^T and dL/db = a^T @ grad.
    # Two library matmuls in the accumulate dtype, then back to the input dtype.
    b, a = ctx.saved_tensors
    grad_a = grad_b = None
    if ctx.needs_input_grad[0]:
        grad_a = torch.matmul(grad, b.transpose(0, 1).to(grad.dtype)).to(b.dtype)
    if ctx.needs_input_grad[1]:
        grad_b = torch.matmul(a.transpose(0, 1).to(grad.dtype), grad).to(a.dtype)
    return grad_a, grad_b


# The registrations belong to a Library object, so that importlib.reload(op) can
# drop the previous module's registrations before adding its own: a second
# register_fake on the same operator is refused.
_previous_registrations = globals().get("_registrations")
if _previous_registrations is not None:
    _previous_registrations._destroy()
_registrations = torch.library.Library("day87", "FRAGMENT")
torch.library.register_fake("day87::wmma_mm", _fake, lib=_registrations)
torch.library.register_autograd("day87::wmma_mm", _backward, setup_context=_setup_context,
                                lib=_registrations)


def wmma_mm(a, b):
    """a @ b through day87::wmma_mm: float16 in and float32 out on CUDA, float64 on CPU."""
    return torch.ops.day87.wmma_mm(a, b)


if __name__ == "__main__":
    # bench.py does `import op`: let that name this module rather than import
    # op.py a second time, which would register the fake and backward twice.
    sys.modules["op"] = sys.modules[__name__]
    import bench
    bench.main(sys.argv[1:])
