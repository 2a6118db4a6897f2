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
# The build: kernel.cu and binding.cpp compiled into one library at the first import.
# ===========================================================================
import hashlib, os, sys  # noqa: E401, E402

HERE = os.path.dirname(os.path.abspath(__file__))
NAMESPACE = "day87"  # binding.cpp's TORCH_LIBRARY namespace, and its build folder's prefix
SOURCES = ("kernel.cu", "binding.cpp")


def build_plan(namespace=NAMESPACE, folder=HERE, sources=SOURCES, depends=(), cflags=(), more_archs=()):
    """The build of `sources` (in `folder`; `depends`: files they include; `more_archs`: to build for
    beside the usual) and the folder its key names."""
    toolkit = find_toolkit() if torch.version.cuda else None
    compiled = tuple(name for name in sources if toolkit or not name.endswith(".cu"))  # else CPU alone
    # Code for the card at hand alone launches there and on no newer card ("no kernel image
    # is available" on the machine it ships to): every visible card's architecture, and
    # PTX on the newest, which the driver compiles for any card that came later.
    archs = ";".join([architecture_list(), *more_archs]) if toolkit else None
    # The key: what the library depends on, hashed into its folder's name, so that a change
    # builds anew, never loads a stale library. torch's version and CUDA build are in it as the
    # library links against this libtorch's C++ symbols: another torch says "undefined symbol".
    digest = hashlib.sha256()
    for path in [os.path.join(folder, name) for name in compiled] + list(depends):
        with open(path, "rb") as source:
            digest.update(os.path.basename(path).encode() + b"\0" + source.read() + b"\0")
    for part in (torch.__version__, torch.version.cuda, archs, sys.version, sys.platform, *cflags):
        digest.update(str(part).encode() + b"\0")
    key = digest.hexdigest()[:16]
    cache = os.environ.get("TORCH_EXTENSIONS_DIR") or os.path.expanduser("~/.cache/torch_extensions")
    directory = os.path.join(cache, f"{namespace}-{key}")
    return {"namespace": namespace, "extension": f"{namespace}_ext", "folder": folder, "sources": compiled,
            "depends": tuple(depends), "cflags": tuple(cflags), "with_cuda": toolkit is not None,
            "toolkit": toolkit, "cuda_home": toolkit and toolkit["home"], "archs": archs, "key": key,
            "directory": directory, "library": os.path.join(directory, f"{namespace}_ext.so"),
            "done_marker": os.path.join(directory, "build-complete"),  # both: see _build
            "failed_marker": os.path.join(directory, "build-failed")}


def build(plan):
    """Compile and link plan["sources"] into plan["library"]; _build calls it under its lock."""
    # _toolkit_for points cpp_extension at the plan's toolkit and architectures, not those it guesses.
    with _toolkit_for(plan) as (cpp_extension, include_paths, link_flags):
        cpp_extension.load(
            name=plan["extension"],
            sources=[os.path.join(plan["folder"], name) for name in plan["sources"]],
            # binding.cpp registers its CUDA implementation only where kernel.cu is built too.
            extra_cflags=["-O2", *plan["cflags"]] + (["-DDAY87_WITH_CUDA"] if plan["with_cuda"] else []),
            # -lineinfo lets compute-sanitizer name kernel.cu's lines, at no cost at run time.
            extra_cuda_cflags=["-O3", "-lineinfo"],
            extra_include_paths=include_paths,
            extra_ldflags=link_flags,
            build_directory=plan["directory"],
            # No Python module: binding.cpp's TORCH_LIBRARY blocks register the operators
            # from static initialisers, which run as the library is loaded.
            is_python_module=False)


# ==== The machinery: what real machines need. A student need not read on. ====================
import contextlib, filecmp, logging, pathlib, re, shutil, stat, subprocess  # noqa: E401, E402
BUILD_LOCK_TIMEOUT_S = float(os.environ.get("DAY87_BUILD_LOCK_TIMEOUT_S", "900"))  # for another's build
TOOLKIT_FIX = (f'pip install "cuda-toolkit[nvcc,cccl]=={torch.version.cuda}.*" (this torch\'s CUDA, into this '
               "environment; op.py finds it there)" if int((torch.version.cuda or "0").split(".")[0]) >= 13 else
               f"install the CUDA {torch.version.cuda} toolkit and set CUDA_HOME to it (PyPI's CUDA 12 wheels "
               "carry ptxas but no nvcc)")


def _say(message):  # stderr, flushed: seen in a terminal, a notebook cell and a CI log alike
    print(f"day87: {message}", file=sys.stderr, flush=True)


def architecture_list():  # as TORCH_CUDA_ARCH_LIST spells them, which wins where set
    if os.environ.get("TORCH_CUDA_ARCH_LIST") or not torch.cuda.is_available():  # no card (CI): the T4 up
        return os.environ.get("TORCH_CUDA_ARCH_LIST") or "7.5;8.0;8.6;8.9;9.0+PTX"
    cards = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
    return ";".join(f"{major}.{minor}" for major, minor in cards) + "+PTX"


def find_toolkit():
    """The CUDA toolkit to build with, or None, looked for in README's order (and for its reasons)."""
    chosen, major = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH"), torch.version.cuda.split(".")[0]
    # pip's cuda-toolkit wheels: nvidia/cu13 (maybe in another site-packages), with no libcudart.so to link.
    parts = []
    with contextlib.suppress(ImportError):
        import nvidia  # the namespace package that the wheels install into
        parts = [] if chosen else [os.path.join(root, f"cu{major}") for root in nvidia.__path__]
    if homes := [part for part in parts if os.path.exists(f"{part}/bin/nvcc")]:
        cudart = (f"{part}/lib/libcudart.so.{major}" for part in parts)
        return {"home": homes[0], "cudart": next(filter(os.path.exists, cudart), None),
                "include": [f"{part}/include" for part in parts if os.path.isdir(f"{part}/include")]}
    nvcc = shutil.which("nvcc")
    for home in [chosen] if chosen else [
            nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]:
        if home and os.path.exists(f"{home}/bin/nvcc") and os.path.exists(f"{home}/include/cuda_runtime.h"):
            return {"home": home, "include": [], "cudart": None}
    return None


def nvcc_version_text(cuda_home):
    return subprocess.run([os.path.join(cuda_home, "bin", "nvcc"), "--version"],
                          capture_output=True, text=True, check=True).stdout.strip()


@contextlib.contextmanager
def _toolkit_for(plan):
    """cpp_extension pointed at the plan's toolkit and architectures, and that toolkit's flags."""
    # Its import warns "No CUDA runtime is found" where no GPU is; the build line says which toolkit.
    logger = logging.getLogger("torch.utils.cpp_extension")
    disabled, logger.disabled = logger.disabled, True
    from torch.utils import cpp_extension
    logger.disabled = disabled
    toolkit, link_flags = plan["toolkit"] or {"include": [], "cudart": None}, []
    saved = os.environ.get("TORCH_CUDA_ARCH_LIST")
    if plan["with_cuda"]:
        cpp_extension.CUDA_HOME = toolkit["home"]
        os.environ["TORCH_CUDA_ARCH_LIST"] = plan["archs"]
    if toolkit["cudart"]:  # -lcudart needs a libcudart.so: link one in
        link = os.path.join(plan["directory"], "cudart", "libcudart.so")
        os.makedirs(os.path.dirname(link), exist_ok=True)
        if not os.path.lexists(link):
            os.symlink(toolkit["cudart"], link)
        link_flags = [f"-L{os.path.dirname(link)}"]
    try:
        yield cpp_extension, toolkit["include"], link_flags
    finally:  # the environment as it was
        os.environ.pop("TORCH_CUDA_ARCH_LIST", None)
        os.environ.update({} if saved is None else {"TORCH_CUDA_ARCH_LIST": saved})


def _build(plan, check_more=None):
    """build(plan), one process at a time, once refusals passed and a killed build's leftovers are gone."""
    from filelock import FileLock, Timeout  # torch depends on filelock
    directory = plan["directory"]
    try:
        os.makedirs(directory, mode=0o700, exist_ok=True)  # private to its owner
        _refuse_unless_private(directory)
        # An flock: the kernel releases it when its holder dies, so a killed build never blocks the next.
        lock = FileLock(os.path.join(directory, "op.lock"))
        try:
            held = lock.acquire(timeout=0)
        except Timeout:
            _say(f"another process is building in {directory}; waiting for it")
            held = lock.acquire(timeout=BUILD_LOCK_TIMEOUT_S)
    except Timeout:
        raise RuntimeError(f"day87: waited {BUILD_LOCK_TIMEOUT_S:.0f} s for the process that holds "
                           f"{lock.lock_file} to finish its build. If no other Python process is building "
                           "day87, delete that file and import again; DAY87_BUILD_LOCK_TIMEOUT_S sets the "
                           "wait.") from None
    except OSError as error:
        raise RuntimeError(f"day87: cannot write the build cache {directory}: {error}. "
                           "Set TORCH_EXTENSIONS_DIR to a writable folder.") from None
    with held:
        if os.path.exists(plan["done_marker"]):
            return  # the process we waited for built it
        if shutil.which("ninja") is None:
            raise RuntimeError("day87: building the extension needs ninja, and none is on PATH. "
                               "Fix: pip install ninja (it is in requirements.txt).")
        if plan["with_cuda"]:  # a mismatched pair would build and then not load
            found = re.search(r"release (\d+)\.(\d+)", text := nvcc_version_text(plan["cuda_home"]))
            nvcc_major = found.group(1) if found else "unknown"
            if nvcc_major != torch.version.cuda.split(".")[0]:
                raise RuntimeError(
                    f"day87: nvcc in {plan['cuda_home']} is CUDA {found.group(0) if found else text!r}, but "
                    f"torch {torch.__version__} was built with CUDA {torch.version.cuda}. Their major versions "
                    f"must match: an extension built by one cannot load beside the other. Fix: {TOOLKIT_FIX}; "
                    f"or install a torch built for CUDA {nvcc_major}.x (the cu{nvcc_major}* index at "
                    "https://download.pytorch.org/whl/).")
            if check_more:
                check_more(plan)
        # cpp_extension's own lock file: as we hold op.lock, one here is a failed build's or a
        # killed one's (on torch releases whose load() waits while it exists, forever).
        stale_lock = os.path.join(directory, "lock")
        if os.path.exists(plan["failed_marker"]):
            _say(f"the last build in {directory} failed "
                 f"({pathlib.Path(plan['failed_marker']).read_text().strip()}); building again")
            os.remove(plan["failed_marker"])
        elif os.path.exists(stale_lock):
            _say(f"removing {stale_lock}, left by a build that was killed")
        with contextlib.suppress(FileNotFoundError):
            os.remove(stale_lock)
        what = (f"for sm {plan['archs']} with the toolkit in {plan['cuda_home']}" if plan["with_cuda"] else
                f"CPU part only ({'no CUDA toolkit found' if torch.version.cuda else 'torch has no CUDA'})")
        _say(f"building the extension {what} in {directory}; a first build takes tens of seconds")
        try:
            build(plan)
        except (RuntimeError, OSError) as error:
            first_error, message = _explain_build_failure(error, plan)
            pathlib.Path(plan["failed_marker"]).write_text(first_error + "\n")  # the next import says so
            raise RuntimeError(message) from None
        # A umask of 002 would leave it group-writable, and the check before every load refuse it.
        os.chmod(plan["library"], os.stat(plan["library"]).st_mode & ~0o022)
        # Last: a library that a killed link left half-written has no marker, and is rebuilt.
        pathlib.Path(plan["done_marker"]).write_text(f"{plan['key']}\n{plan['folder']}\n")  # built from


def _explain_build_failure(error, plan):
    """(the failure in one line, the message to raise) for an error out of build()."""
    text, cause = str(error), error.__cause__ or error.__context__
    while cause is not None:  # torch 2.14 wraps the loader's OSError in a RuntimeError
        text, cause = f"{text}\n{cause}", cause.__cause__ or cause.__context__
    missing = re.search(r"undefined symbol: (\S+)", text)
    if not missing:  # a compiler's log
        first = first_compiler_error(text)
        return (first or "see the log", f"{text}\n\nday87: the build failed. Its first error"
                + (f":\n    {first}" if first else " is in the log above") + "\nFix it and import again.")
    # A library that links and then does not load: one message, in C++'s words.
    symbol = missing.group(1)
    if shutil.which("c++filt"):  # binutils, beside the compiler that built the library
        symbol = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip() or symbol
    # A free function's mangled name is _Z, its name's length, its name: "_Z14launchWmmaGemm...".
    mangled = re.match(r"_Z(\d+)", symbol)
    function = (symbol[len(mangled[0]):len(mangled[0]) + int(mangled[1])] if mangled
                else re.match(r"[\w:]+", symbol).group(0).split("::")[-1])
    # Named in two of the build's files (or of the lesson's, which another folder's include): ours.
    paths = [os.path.join(plan["folder"], name) for name in plan["sources"]] + list(plan["depends"])
    ours = sum(function in pathlib.Path(path).read_text() for path in paths) >= 2
    return (f"undefined symbol {symbol}", "day87: the library built but does not load: " + (
        f"nothing defines {symbol}. binding.cpp declares {function} near its top and kernel.cu defines "
        "it: the two must have the same parameter types in the same order, or the call links to a "
        f"function that does not exist. Fix: make binding.cpp's declaration of {function} match its "
        f"definition in kernel.cu (in {plan['folder']})." if ours else
        f"undefined symbol {symbol}. It was linked against another libtorch than the one this "
        f"interpreter loaded (torch {torch.__version__} from {os.path.dirname(torch.__file__)}). "
        "Fix: build and import from the same environment."))


def first_compiler_error(log):
    """'kernel.cu:123: message' for a build log's first error (gcc's file:line:column:, nvcc's file(line):)."""
    error = re.compile(r"\s*(\S+?)(?::(\d+)(?::\d+)?|\((\d+)\)):\s*(?:fatal )?error:?\s*(.*)")
    found = next(filter(None, map(error.match, log.splitlines())), None)
    return (f"{os.path.basename(found[1])}:{found[2] or found[3]}: {found[4]}" if found else
            next((line.strip() for line in log.splitlines() if re.search(r"\berror\b", line)), None))


def _refuse_unless_private(*paths):
    """A library is code this process will run: refuse one that others own, could write or swap."""
    mode = os.stat(cache_root := os.path.dirname(paths[0])).st_mode
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


def load_extension(module_file, check_more=None, **extension):
    """Load an extension, built first where needed, once per process; return its plan. `module_file`
    registers its fake and backward; check_more(plan) refuses more before a build; `extension`: build_plan's."""
    plan = build_plan(**extension)
    namespace, library = plan["namespace"], plan["library"]
    loaded = [path for path in torch.ops.loaded_libraries
              if os.path.basename(path) == os.path.basename(library)]
    # One library per namespace in a process: a second registering it would abort the interpreter, and a
    # second fake or backward is refused. served_by is register_once's: the file imported, not the builder.
    served_by, differs = getattr(getattr(torch.ops, namespace), "registered_by", None), None
    if loaded and loaded[0] != library:
        differs = f"its sources differ from those of the loaded library {loaded[0]}: it needs {library}"
    elif served_by not in (None, module_file) and not filecmp.cmp(served_by, module_file, shallow=False):
        differs = f"its {os.path.basename(module_file)} differs, and with it the fake and the backward"
    if differs:
        raise RuntimeError(
            f"day87: torch.ops.{namespace} is already served in this process by "
            f"{served_by or 'a module imported earlier'}. The module being imported, {module_file}, is not the "
            f"same ({differs}), and a process holds one {namespace} namespace. Fix: restart the Python process "
            "(the notebook kernel) and import one of them; to compare two lessons in one process, give the "
            "next one's namespace a name of its own.")
    if loaded:
        return plan  # a reload, or a copy of identical sources: the same library
    if torch.version.cuda and not plan["with_cuda"]:
        chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
        where = (f"CUDA_HOME={chosen} holds no bin/nvcc and include/cuda_runtime.h" if chosen else
                 "no CUDA_HOME, no cuda-toolkit wheels, no nvcc on PATH, no /usr/local/cuda")
        _say(f"no CUDA toolkit found ({where}): only the CPU implementation is built, and calls on "
             f"CUDA tensors will fail. Fix: {TOOLKIT_FIX}")
    if not os.path.exists(plan["done_marker"]):
        _build(plan, check_more)
    _refuse_unless_private(plan["directory"], library, plan["done_marker"])
    try:
        torch.ops.load_library(library)
    except OSError as error:
        raise RuntimeError(f"day87: cannot load {library} ({error}). The build there is damaged; "
                           f"delete {plan['directory']} and import again to rebuild it.") from None
    return plan


def register_once(namespace, module_file, register, previous):
    """register()'s Library where module_file is the first in this process to serve namespace, else None
    (an identical copy did). `previous`: this module's Library from before a reload, dropped first."""
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
