"""op.py: day87::wmma_mm, its fake implementation and its backward, built at import.

    import op
    c = op.wmma_mm(a, b)   # a (M x K), b (K x N): float16 on CUDA gives float32,
                           # float64 on the CPU gives float64

The first import compiles kernel.cu and binding.cpp (tens of seconds, said in one
line); later imports load the cached library without running a compiler.
"""

import torch

# The tile the CUDA kernel needs the shape to divide: M, N and K. kernel.cu holds
# the same numbers for C++ (kTileM, kTileN, kTileK); this is the Python copy.
TILE_M, TILE_N, TILE_K = 128, 128, 16


def wmma_mm(a, b):
    """a @ b through day87::wmma_mm: float16 in, float32 out on CUDA; float64 on the CPU."""
    return torch.ops.day87.wmma_mm(a, b)


def accumulate_dtype(input_dtype):
    """The output dtype for an input dtype: FP16 accumulates and is stored in FP32,
    the float64 reference path stays in float64."""
    widened = {torch.float16: torch.float32, torch.float64: torch.float64}
    if input_dtype not in widened:
        raise TypeError(f"day87::wmma_mm: rule 'dtype': inputs must be torch.float16 (CUDA) "
                        f"or torch.float64 (CPU); got {input_dtype}")
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
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None,
                          b if ctx.needs_input_grad[0] else None)


def _backward(ctx, grad):
    # c[i][j] = sum_p a[i][p] b[p][j], so dL/da = grad @ b^T and dL/db = a^T @ grad.
    a, b = ctx.saved_tensors
    grad_a, grad_b = None, None
    if ctx.needs_input_grad[0]:
        # a is None on this branch (see _setup_context); b has the same dtype.
        wide_b = b.transpose(0, 1).to(grad.dtype)
        grad_a = torch.matmul(grad, wide_b).to(b.dtype)
    if ctx.needs_input_grad[1]:
        wide_a = a.transpose(0, 1).to(grad.dtype)
        grad_b = torch.matmul(wide_a, grad).to(a.dtype)
    return grad_a, grad_b


def _register():
    """The two registrations that live in Python. They need the schema that
    binding.cpp defines, so they run once the library is loaded (end of file)."""
    # A Library object owns them, unlike the lesson's decorators, so that
    # importlib.reload(op) can drop the previous module's registrations first.
    library = torch.library.Library("day87", "FRAGMENT")
    torch.library.register_fake("day87::wmma_mm", _fake, lib=library)
    torch.library.register_autograd("day87::wmma_mm", _backward,
                                    setup_context=_setup_context, lib=library)
    return library


# ===========================================================================
# The build. Nothing below is part of the lesson: a student need not read on.
# ===========================================================================
import hashlib  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
EXTENSION_NAME = "day87_ext"
# Built when torch has CUDA but no card is visible (CI, a login node): every
# architecture from the T4 up, with PTX for the last so that newer cards JIT it.
ARCHS_WITHOUT_A_CARD = "7.5;8.0;8.6;8.9;9.0+PTX"
# A concurrent first import waits for the build in progress at most this long.
BUILD_LOCK_TIMEOUT_S = float(os.environ.get("DAY87_BUILD_LOCK_TIMEOUT_S", "900"))


def _say(message):
    # stderr, flushed: seen in a terminal, a notebook cell and a CI log alike.
    print(f"day87: {message}", file=sys.stderr, flush=True)


def find_cuda_home():
    """The CUDA toolkit to build with, or None. CUDA_HOME (or CUDA_PATH), where set,
    is the only candidate: a user who names a toolkit means that one. Otherwise
    the nvcc on PATH, where its folder has the headers (a wrapper script in
    /usr/local/bin would make the toolkit /usr/local), then /usr/local/cuda."""
    chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    nvcc_on_path = shutil.which("nvcc")
    candidates = [chosen] if chosen else [
        nvcc_on_path and os.path.dirname(os.path.dirname(os.path.realpath(nvcc_on_path))),
        "/usr/local/cuda"]
    for home in filter(None, candidates):
        if all(os.path.exists(os.path.join(home, part))
               for part in ("bin/nvcc", "include/cuda_runtime.h")):
            return home
    return None


def nvcc_version_text(cuda_home):
    """The literal output of `nvcc --version`."""
    return subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                          capture_output=True, text=True, check=True).stdout.strip()


def architecture_list():
    """The architectures to build for, as TORCH_CUDA_ARCH_LIST spells them."""
    if os.environ.get("TORCH_CUDA_ARCH_LIST"):
        return os.environ["TORCH_CUDA_ARCH_LIST"]
    if torch.cuda.is_available():
        capabilities = sorted({torch.cuda.get_device_capability(i)
                               for i in range(torch.cuda.device_count())})
        return ";".join(f"{major}.{minor}" for major, minor in capabilities) + "+PTX"
    return ARCHS_WITHOUT_A_CARD


def build_plan():
    """Everything the build depends on, and the directory its hash names: another
    torch, card or edited source never loads a stale library."""
    cuda_home = find_cuda_home() if torch.version.cuda else None
    sources = ("kernel.cu", "binding.cpp") if cuda_home else ("binding.cpp",)
    archs = architecture_list() if cuda_home else None
    digest = hashlib.sha256()
    for name in sources:
        with open(os.path.join(HERE, name), "rb") as source:
            digest.update(name.encode() + b"\0" + source.read() + b"\0")
    for part in (torch.__version__, torch.version.cuda, archs, sys.version, sys.platform):
        digest.update(str(part).encode() + b"\0")
    key = digest.hexdigest()[:16]
    cache_root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions")
    directory = os.path.join(cache_root, f"day87-{key}")
    return {"with_cuda": cuda_home is not None, "cuda_home": cuda_home, "sources": sources,
            "archs": archs, "key": key, "directory": directory,
            "library": os.path.join(directory, f"{EXTENSION_NAME}.so"),
            # Written only after a build succeeded: a library that a killed link
            # left half-written has no marker and is rebuilt, never loaded.
            "done_marker": os.path.join(directory, "build-complete")}


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


def _build(plan):
    """Compile and link into plan['directory'], one process at a time."""
    from filelock import FileLock, Timeout  # torch depends on filelock

    try:
        os.makedirs(plan["directory"], exist_ok=True)
        # An flock underneath: the kernel releases it when its holder dies, so a
        # killed build never blocks the next one.
        lock = FileLock(os.path.join(plan["directory"], "op.lock"))
        try:
            lock.acquire(timeout=0)
        except Timeout:
            _say(f"another process is building in {plan['directory']}; waiting for it")
            lock.acquire(timeout=BUILD_LOCK_TIMEOUT_S)
    except Timeout:
        raise RuntimeError(
            f"day87: waited {BUILD_LOCK_TIMEOUT_S:.0f} s for the process that holds "
            f"{lock.lock_file} to finish its build. If no other Python process is building "
            "day87, delete that file and import again; DAY87_BUILD_LOCK_TIMEOUT_S sets the "
            "wait.") from None
    except OSError as error:
        raise RuntimeError(f"day87: cannot write the build cache {plan['directory']}: {error}. "
                           "Set TORCH_EXTENSIONS_DIR to a writable folder.") from None
    try:
        if os.path.exists(plan["done_marker"]):
            return  # the process we waited for built it
        _check_toolchain(plan)
        # We hold the lock, so no live op.py builds here: a cpp_extension lock
        # file left over belongs to a killed build (and would make load() wait
        # forever), and so does any library without the done marker.
        stale_lock = os.path.join(plan["directory"], "lock")
        if os.path.exists(stale_lock):
            _say(f"removing {stale_lock}, left by a build that was killed")
            os.remove(stale_lock)
        what = (f"for sm {plan['archs']} with {plan['cuda_home']}" if plan["with_cuda"]
                else "CPU part only (" + ("torch has no CUDA" if not torch.version.cuda
                                          else "no CUDA toolkit found") + ")")
        _say(f"building the extension {what} in {plan['directory']}; "
             "a first build takes tens of seconds")
        _compile(plan)
        with open(plan["done_marker"], "w") as marker:
            marker.write(plan["key"] + "\n")
    finally:
        lock.release()


def _compile(plan):
    from torch.utils import cpp_extension

    # cpp_extension reads the toolkit at its import and the architectures from
    # the environment; point both at the plan for this build only.
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if plan["with_cuda"]:
        cpp_extension.CUDA_HOME = plan["cuda_home"]
        os.environ["TORCH_CUDA_ARCH_LIST"] = plan["archs"]
    try:
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
        if saved is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved


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
        _say("no CUDA toolkit found (CUDA_HOME, the nvcc on PATH, /usr/local/cuda): only "
             "the CPU implementation is built, and calls on CUDA tensors will fail. Install "
             f"the CUDA {torch.version.cuda} toolkit and set CUDA_HOME to build the kernel.")
    if not os.path.exists(plan["done_marker"]):
        _build(plan)
    torch.ops.load_library(plan["library"])
    return plan


BUILD = _load()
if "_registrations" in globals():  # importlib.reload(op): drop the old ones first
    _registrations._destroy()
_registrations = _register()
