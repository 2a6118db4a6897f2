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
    check_tensors("day87::wmma_mm", a, b)
    return torch.ops.day87.wmma_mm(a, b)


def check_tensors(op_name, a, b):
    """The rule 'two matrices' for what is not a tensor at all: the dispatcher
    would say only that it found no device."""
    for name, value in (("a", a), ("b", b)):
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{op_name}: rule 'two matrices': {name} must be a 2-D tensor; "
                            f"got {type(value).__name__}")


def accumulate_dtype(input_dtype):
    """The output dtype for an input dtype: FP16 accumulates and is stored in FP32,
    the float64 reference path stays in float64. Shared by every operator that keeps
    this contract, so its message names none of them; each one's own dtype rule
    comes first."""
    widened = {torch.float16: torch.float32, torch.float64: torch.float64}
    if input_dtype not in widened:
        raise TypeError(f"day87: accumulate_dtype: no accumulate dtype for {input_dtype}; the "
                        "operators take torch.float16 (CUDA) or torch.float64 (CPU)")
    return widened[input_dtype]


def _fake(a, b):
    # Shapes and dtypes only: a fake tensor has no data to read. This is what lets
    # torch.compile plan around the operator instead of breaking the graph there.
    check_matrices("day87::wmma_mm", a, b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=accumulate_dtype(a.dtype))


def check_matrices(op_name, a, b):
    """The rules of binding.cpp's contract that a fake tensor can show, worded as
    binding.cpp words them, so that a compiled call fails with the same message as
    an eager one. op_name starts each message: a second operator passes its own."""
    def broke(rule, requirement):
        return lambda: (f"{op_name}: rule '{rule}': {requirement}; "
                        f"got a: {described(a)}, b: {described(b)}")
    torch._check(a.dim() == 2 and b.dim() == 2, broke("two matrices", "a and b must be 2-D"))
    torch._check(a.device == b.device, broke("one device", "a and b must be on the same device"))
    expected = torch.float16 if a.device.type == "cuda" else torch.float64
    torch._check(a.dtype == expected and b.dtype == expected,
                 broke("dtype", f"on {a.device} a and b must be {expected}"))
    torch._check(a.shape[1] == b.shape[0],
                 broke("inner dimensions", "a.size(1) must equal b.size(0)"))
    if a.device.type == "cuda":  # one check per size: each becomes a guard of its own
        for size, tile in ((a.shape[0], TILE_M), (b.shape[1], TILE_N), (a.shape[1], TILE_K)):
            torch._check(size % tile == 0, lambda: (
                f"{op_name}: rule 'tile': M, N and K must be multiples of {TILE_M}, "
                f"{TILE_N} and {TILE_K}; got M={a.shape[0]}, N={b.shape[1]}, K={a.shape[1]}"))


def described(t):  # "4x3 torch.float64 on cpu", as binding.cpp describes a tensor
    return f"{'x'.join(str(size) for size in t.shape) or 'scalar'} {t.dtype} on {t.device}"


def _setup_context(ctx, inputs, output):
    a, b = inputs
    # Save each input only when its partner needs a gradient: grad_a needs b and
    # grad_b needs a. No copy is made; autograd keeps a reference.
    ctx.save_for_backward(a if ctx.needs_input_grad[1] else None,
                          b if ctx.needs_input_grad[0] else None)


def _backward(ctx, grad):
    # c[i][j] = sum_p a[i][p] b[p][j], so dL/da = grad @ b^T and dL/db = a^T @ grad:
    # two library matmuls in the accumulate dtype (day 39's rule: a library operation
    # where it fits), each rounded back to its input's dtype.
    a, b = ctx.saved_tensors
    grad_a, grad_b = None, None
    if ctx.needs_input_grad[0]:
        # a may be None here (saved only when b wants a gradient: _setup_context);
        # b is not, and the contract gives it a's dtype, the one grad_a must have.
        wide_b = b.transpose(0, 1).to(grad.dtype)
        grad_a = torch.matmul(grad, wide_b).to(b.dtype)
    if ctx.needs_input_grad[1]:
        wide_a = a.transpose(0, 1).to(grad.dtype)
        grad_b = torch.matmul(wide_a, grad).to(a.dtype)
    return grad_a, grad_b


def _register():
    """The registrations that live in Python: wmma_mm's fake and backward. They need
    the schema that binding.cpp defines, so they run once the library is loaded
    (end of file)."""
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
import logging  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shutil  # noqa: E402
import stat  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
# The lesson's extension: its namespace (TORCH_LIBRARY's, and the build folder's
# prefix) and its sources. load_extension builds another folder's the same way.
NAMESPACE = "day87"
SOURCES = ("kernel.cu", "binding.cpp")
# Built when torch has CUDA but no card is visible (CI, a login node): every
# architecture from the T4 up, with PTX for the last so that newer cards JIT it.
ARCHS_WITHOUT_A_CARD = "7.5;8.0;8.6;8.9;9.0+PTX"
# A concurrent first import waits for the build in progress at most this long.
BUILD_LOCK_TIMEOUT_S = float(os.environ.get("DAY87_BUILD_LOCK_TIMEOUT_S", "900"))


def _say(message):
    # stderr, flushed: seen in a terminal, a notebook cell and a CI log alike.
    print(f"day87: {message}", file=sys.stderr, flush=True)


def find_toolkit():
    """The CUDA toolkit to build with, or None, looked for in this order:
    1. CUDA_HOME (or CUDA_PATH), where set, and nothing else: a user who names a
       toolkit means that one.
    2. The cuda-toolkit wheels that pip installed into this environment, at torch's
       CUDA major version: pinned beside torch, the one toolkit that cannot mismatch.
    3. The nvcc on PATH, where its folder has the headers (a wrapper script in
       /usr/local/bin would make the toolkit /usr/local).
    4. /usr/local/cuda.
    Returns {"home": the folder of bin/nvcc, "include": more header folders,
    "cudart": the libcudart to link against where the toolkit has no
    unversioned libcudart.so (the wheels ship only libcudart.so.N)}."""
    chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    from_pip = None if chosen else _pip_toolkit()
    if from_pip:
        return from_pip
    nvcc_on_path = shutil.which("nvcc")
    candidates = [chosen] if chosen else [
        nvcc_on_path and os.path.dirname(os.path.dirname(os.path.realpath(nvcc_on_path))),
        "/usr/local/cuda"]
    for home in filter(None, candidates):
        if all(os.path.exists(os.path.join(home, part))
               for part in ("bin/nvcc", "include/cuda_runtime.h")):
            return {"home": home, "include": [], "cudart": None}
    return None


def _pip_toolkit():
    """nvcc from `pip install "cuda-toolkit[nvcc,cccl]"` at torch's CUDA major: the
    CUDA 13 wheels put it in nvidia/cu13, beside the runtime that torch's own
    wheels installed there, or in another site-packages folder (a venv over
    system packages). PyPI's CUDA 12 wheels ship ptxas but no nvcc."""
    try:
        import nvidia  # the namespace package that the wheels install into
    except ImportError:
        return None
    major = torch.version.cuda.split(".")[0]
    parts = [os.path.join(root, f"cu{major}") for root in nvidia.__path__
             if os.path.isdir(os.path.join(root, f"cu{major}"))]
    homes = [part for part in parts if os.path.exists(os.path.join(part, "bin", "nvcc"))]
    if not homes:
        return None
    cudart = [os.path.join(part, "lib", f"libcudart.so.{major}") for part in parts]
    return {"home": homes[0], "include": [os.path.join(part, "include") for part in parts
                                          if os.path.isdir(os.path.join(part, "include"))],
            "cudart": next(filter(os.path.exists, cudart), None)}


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


def build_plan(namespace=NAMESPACE, folder=HERE, sources=SOURCES, depends=(), cflags=()):
    """Everything a build depends on, and the directory its hash names: another
    torch, card or edited source never loads a stale library. `sources` are the
    files in `folder` to compile (a build without CUDA compiles the .cpp ones
    alone); `depends`, other files they include, whose contents enter the hash
    too; `cflags`, more flags for the C++ compiler."""
    toolkit = find_toolkit() if torch.version.cuda else None
    compiled = tuple(name for name in sources if toolkit or not name.endswith(".cu"))
    archs = architecture_list() if toolkit else None
    digest = hashlib.sha256()
    for path in [os.path.join(folder, name) for name in compiled] + list(depends):
        with open(path, "rb") as source:
            digest.update(os.path.basename(path).encode() + b"\0" + source.read() + b"\0")
    for part in (torch.__version__, torch.version.cuda, archs, sys.version, sys.platform, *cflags):
        digest.update(str(part).encode() + b"\0")
    key = digest.hexdigest()[:16]
    cache_root = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_extensions")
    directory = os.path.join(cache_root, f"{namespace}-{key}")
    extension = f"{namespace}_ext"
    return {"namespace": namespace, "extension": extension, "folder": folder,
            "with_cuda": toolkit is not None, "toolkit": toolkit,
            "cuda_home": toolkit and toolkit["home"], "sources": compiled,
            "depends": tuple(depends), "cflags": tuple(cflags),
            "archs": archs, "key": key, "directory": directory,
            "library": os.path.join(directory, f"{extension}.so"),
            # Written only after a build succeeded: a library that a killed link
            # left half-written has no marker and is rebuilt, never loaded.
            "done_marker": os.path.join(directory, "build-complete"),
            # Written when a build failed, with its first error: the next import
            # says so, rather than mistaking what the failure left for a killed build.
            "failed_marker": os.path.join(directory, "build-failed")}


def _toolkit_fix():
    """What to install for a toolkit that matches this torch."""
    if int(torch.version.cuda.split(".")[0]) >= 13:  # from PyPI, into this environment
        return (f'pip install "cuda-toolkit[nvcc,cccl]=={torch.version.cuda}.*" (this torch\'s '
                "CUDA, into this environment; op.py finds it there)")
    return (f"install the CUDA {torch.version.cuda} toolkit and set CUDA_HOME to it (PyPI's "
            "CUDA 12 wheels carry ptxas but no nvcc)")


def _check_toolchain(plan, check_more=None):
    """Refuse, before compiling, what would fail late or load wrong; then
    check_more(plan), another extension's own refusals, where given."""
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
            f"other. Fix: {_toolkit_fix()}; or install a torch built for CUDA {nvcc_major}.x "
            f"(the cu{nvcc_major}* index at https://download.pytorch.org/whl/).")
    if check_more:
        check_more(plan)


def _build(plan, check_more=None):
    """Compile and link into plan['directory'], one process at a time."""
    from filelock import FileLock, Timeout  # torch depends on filelock

    try:
        os.makedirs(plan["directory"], mode=0o700, exist_ok=True)  # private to its owner
        _refuse_unless_private(plan["directory"])
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
        _check_toolchain(plan, check_more)
        # We hold the lock, so no live op.py builds here: a cpp_extension lock
        # file left over belongs to a build that was killed (on torch releases whose
        # load() waits while that file exists, it would wait forever), and so does
        # any library without the done marker. A failed build removes its own.
        stale_lock = os.path.join(plan["directory"], "lock")
        if os.path.exists(plan["failed_marker"]):
            _say(f"the last build in {plan['directory']} failed ({_text(plan['failed_marker']).strip()}); "
                 "building again")
            os.remove(plan["failed_marker"])
        elif os.path.exists(stale_lock):
            _say(f"removing {stale_lock}, left by a build that was killed")
        if os.path.exists(stale_lock):
            os.remove(stale_lock)
        what = (f"for sm {plan['archs']} with the toolkit in {plan['cuda_home']}" if plan["with_cuda"]
                else "CPU part only (" + ("torch has no CUDA" if not torch.version.cuda
                                          else "no CUDA toolkit found") + ")")
        _say(f"building the extension {what} in {plan['directory']}; "
             "a first build takes tens of seconds")
        try:
            _compile(plan)
        except (RuntimeError, OSError) as error:
            first_error, message = _explain_build_failure(error, plan)
            with open(plan["failed_marker"], "w") as marker:
                marker.write(first_error + "\n")
            if os.path.exists(stale_lock):
                os.remove(stale_lock)
            raise RuntimeError(message) from None
        # A umask of 002 would leave the library group-writable, and the check
        # before every load would then refuse it.
        os.chmod(plan["library"], os.stat(plan["library"]).st_mode & ~0o022)
        with open(plan["done_marker"], "w") as marker:
            marker.write(f"{plan['key']}\n{plan['folder']}\n")  # the folder it was built from
    finally:
        lock.release()


def _compile(plan):
    # Its import guesses a toolkit of its own and warns "No CUDA runtime is found"
    # wherever no GPU is visible; the build line names the toolkit actually used.
    logger = logging.getLogger("torch.utils.cpp_extension")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        from torch.utils import cpp_extension
    finally:
        logger.setLevel(level)

    # cpp_extension reads the toolkit at its import and the architectures from
    # the environment; point both at the plan for this build only.
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    toolkit, link_folders = plan["toolkit"], []
    if plan["with_cuda"]:
        cpp_extension.CUDA_HOME = toolkit["home"]
        os.environ["TORCH_CUDA_ARCH_LIST"] = plan["archs"]
    if toolkit and toolkit["cudart"]:  # -lcudart needs a libcudart.so: link one in
        link_folders = [os.path.join(plan["directory"], "cudart")]
        os.makedirs(link_folders[0], exist_ok=True)
        if not os.path.lexists(os.path.join(link_folders[0], "libcudart.so")):
            os.symlink(toolkit["cudart"], os.path.join(link_folders[0], "libcudart.so"))
    cflags = ["-O2", *plan["cflags"]] + (["-DDAY87_WITH_CUDA"] if plan["with_cuda"] else [])
    try:
        cpp_extension.load(
            name=plan["extension"],
            sources=[os.path.join(plan["folder"], name) for name in plan["sources"]],
            extra_cflags=cflags,
            # -lineinfo lets compute-sanitizer name kernel.cu's lines; no cost at run time.
            extra_cuda_cflags=["-O3", "-lineinfo"],
            extra_include_paths=toolkit["include"] if toolkit else [],
            extra_ldflags=[f"-L{folder}" for folder in link_folders],
            build_directory=plan["directory"],
            is_python_module=False,
        )
    finally:
        if saved is None:
            os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = saved


def _explain_build_failure(error, plan):
    """(the failure in one line, the message to raise) for an error out of
    cpp_extension.load: a compiler's log ends with its first error, and a library
    that does not load says which symbol, and why it is missing."""
    text, cause = str(error), error.__cause__ or error.__context__
    while cause is not None:  # torch 2.14 wraps the loader's OSError in a RuntimeError
        text, cause = f"{text}\n{cause}", cause.__cause__ or cause.__context__
    missing = re.search(r"undefined symbol: (\S+)", text)
    if missing:
        return _explain_undefined_symbol(missing.group(1), plan)
    first = _first_compiler_error(text)
    return (first or "see the log", f"{text}\n\nday87: the build failed. Its first error"
            + (f":\n    {first}" if first else " is in the log above") + "\nFix it and import again.")


def _first_compiler_error(log):
    """'kernel.cu:123: message' for the first error in a build log (gcc writes
    file:line:column: error:, nvcc file(line): error:), or None."""
    for line in log.splitlines():
        found = re.match(r"\s*(\S+?)(?::(\d+)(?::\d+)?|\((\d+)\)):\s*(?:fatal )?error:?\s*(.*)", line)
        if found:
            return f"{os.path.basename(found[1])}:{found[2] or found[3]}: {found[4]}"
    return next((line.strip() for line in log.splitlines() if re.search(r"\berror\b", line)), None)


def _explain_undefined_symbol(symbol, plan):
    """A library that links and then does not load: one message, in C++'s words."""
    demangled = symbol
    if shutil.which("c++filt"):  # binutils, beside the compiler that built the library
        demangled = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip() or symbol
    # A free function's mangled name is _Z, its name's length, its name: "_Z14launchWmmaGemm...".
    mangled = re.match(r"_Z(\d+)", demangled)
    function = (demangled[len(mangled[0]):len(mangled[0]) + int(mangled[1])] if mangled
                else re.match(r"[\w:]+", demangled).group(0).split("::")[-1])
    # The build's own sources, and the files they include: the lesson's two in a build
    # that includes them (another folder's kernel.cu and binding.cpp do).
    paths = [os.path.join(plan["folder"], name) for name in plan["sources"]] + list(plan["depends"])
    naming = [path for path in paths if function in _text(path)]
    if len(naming) < 2:  # not one of this folder's functions: another libtorch's
        return (f"undefined symbol {demangled}", (
            f"day87: the library built but does not load: undefined symbol {demangled}. It was linked "
            f"against another libtorch than the one this interpreter loaded (torch {torch.__version__} "
            f"from {os.path.dirname(torch.__file__)}). Fix: build and import from the same environment."))
    return (f"undefined symbol {demangled}", (
        f"day87: the library built but does not load: nothing defines {demangled}. binding.cpp "
        f"declares {function} near its top and kernel.cu defines it: the two must have the same "
        "parameter types in the same order, or the call links to a function that does not exist. "
        f"Fix: make binding.cpp's declaration of {function} match its definition in kernel.cu "
        f"(in {plan['folder']})."))


def _refuse_unless_private(*paths):
    """A library is code this process will run: refuse a build folder, or a file
    in it, that another user owns or could have written (a shared cache in /tmp,
    say), and a cache folder where others could swap the build folder."""
    cache_root = os.path.dirname(paths[0])
    mode = os.stat(cache_root).st_mode
    problems = [f"{cache_root} is writable by others and not sticky"] if (
        mode & stat.S_IWOTH and not mode & stat.S_ISVTX) else []
    for path in filter(os.path.exists, paths):
        info = os.stat(path)
        if info.st_uid != os.getuid():
            problems.append(f"{path} belongs to user {info.st_uid}, not to you ({os.getuid()})")
        elif info.st_mode & 0o022:
            problems.append(f"{path} is writable by others (mode {stat.filemode(info.st_mode)})")
    if problems:
        raise RuntimeError(f"day87: refusing to load a library that someone else could have written: "
                           f"{'; '.join(problems)}. Fix: set TORCH_EXTENSIONS_DIR to a folder of your "
                           "own (the default, ~/.cache/torch_extensions, is one), or delete that folder.")


def _text(path):
    with open(path) as file:
        return file.read()


def _refuse_second_library(namespace, module_file, what_differs):
    # registered_by is the file whose import registered the namespace in this process
    # (see register_once): the one a user imported, whichever folder built the cached
    # library it loaded.
    served_by = getattr(getattr(torch.ops, namespace), "registered_by", "a module imported earlier")
    raise RuntimeError(
        f"day87: torch.ops.{namespace} is already served in this process by {served_by}. The "
        f"module being imported, {module_file}, is not the same ({what_differs}), and a process "
        f"holds one {namespace} namespace. "
        "Fix: restart the Python process (the notebook kernel) and import one of them; to "
        "compare two lessons in one process, give the next one's namespace a name of its own.")


def load_extension(module_file, check_more=None, **extension):
    """Load an extension once per process, building it first where needed, and
    return its build plan. `extension` is build_plan's arguments (the lesson's by
    default); `module_file` is the Python file that registers its fake and backward;
    check_more(plan), where given, runs after the toolchain checks before a build."""
    plan = build_plan(**extension)
    namespace = plan["namespace"]
    loaded = [path for path in torch.ops.loaded_libraries
              if os.path.basename(path) == os.path.basename(plan["library"])]
    # A process holds one library per namespace: a second one registering it would
    # abort the interpreter, and a second fake or backward is refused.
    if loaded and loaded[0] != plan["library"]:
        _refuse_second_library(namespace, module_file,
                               f"its sources differ from those of the loaded library {loaded[0]}: "
                               f"it needs {plan['library']}")
    registered_by = getattr(getattr(torch.ops, namespace), "registered_by", module_file)
    if registered_by != module_file and _text(registered_by) != _text(module_file):
        _refuse_second_library(namespace, module_file,
                               f"its {os.path.basename(module_file)} differs, and with it the fake "
                               "and the backward")
    if loaded:
        return plan  # a reload, or a copy of identical sources: the same library
    if torch.version.cuda and not plan["with_cuda"]:
        chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        where = (f"CUDA_HOME={chosen} holds no bin/nvcc and include/cuda_runtime.h" if chosen else
                 "no CUDA_HOME, no cuda-toolkit wheels, no nvcc on PATH, no /usr/local/cuda")
        _say(f"no CUDA toolkit found ({where}): only the CPU implementation is built, and "
             f"calls on CUDA tensors will fail. Fix: {_toolkit_fix()}")
    if not os.path.exists(plan["done_marker"]):
        _build(plan, check_more)
    _refuse_unless_private(plan["directory"], plan["library"], plan["done_marker"])
    try:
        torch.ops.load_library(plan["library"])
    except OSError as error:
        raise RuntimeError(f"day87: cannot load {plan['library']} ({error}). The build there is "
                           f"damaged; delete {plan['directory']} and import again to rebuild it.") from None
    return plan


def register_once(namespace, module_file, register, previous):
    """register() (the module's Python registrations, owned by the Library it
    returns) where module_file is the first in this process to serve namespace;
    None where an identical copy already did. `previous`: this module's Library
    from before an importlib.reload, dropped first."""
    if isinstance(previous, torch.library.Library):
        previous._destroy()
    operators = getattr(torch.ops, namespace)
    if getattr(operators, "registered_by", module_file) != module_file:
        return None
    library = register()
    operators.registered_by = module_file  # for the process: which file serves the namespace
    return library


BUILD = load_extension(__file__)
_registrations = register_once(NAMESPACE, __file__, _register, globals().get("_registrations"))
