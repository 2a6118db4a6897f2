"""day87_fast: day 88's operator: the exercise (wmma_mm_bias) solved, and the lesson's
wmma_mm made fast. Open it after your own attempt at the exercise. From fast/:

    import day87_fast
    c = day87_fast.wmma_mm(a, b)               # the lesson's contract and dtypes
    c = day87_fast.wmma_mm_bias(a, b, bias)    # a @ b + bias, added in the kernel's store

It is built at import. The lesson (op.py, two folders up) is imported first and
supplies what both operators share, written once: the contract's rules and messages
for a and b on the Python side (op.check_tensors, and op.check_matrices for the
fake), the tile, setup_context, the float64 and double-backward formula, and the
build's helpers. fast/csrc/binding.cpp holds its own copy of binding.cpp's rules. What
this file adds: the fake and backward of wmma_mm_bias, the tensor-core backward on
CUDA, and its own build: this folder's sources, the cuBLAS headers that
fast/csrc/binding.cpp's backward needs, and sm_90a.
"""

import glob
import importlib.util
import os
import sys

import torch

FAST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = os.path.join(FAST, "csrc")  # the kernels and the binding
LESSON = os.path.dirname(FAST)


def _the_lesson():
    """The lesson's op.py, the module "op": its contract, its formula and its build.
    Loaded from its file, so that importing this package edits no sys.path; one that
    is already imported (test_op.py imports it) is the one used."""
    if "op" not in sys.modules:
        spec = importlib.util.spec_from_file_location("op", os.path.join(LESSON, "op.py"))
        module = importlib.util.module_from_spec(spec)
        sys.modules["op"] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules["op"]
            raise
    return sys.modules["op"]


op = _the_lesson()

NAMESPACE = "day87_fast"
# What launch_policy.cu includes, the shared header and one file per version: every
# header in csrc/, so that one added later joins the build's key too.
HEADERS = sorted(glob.glob(os.path.join(SOURCES, "*.cuh")))


def wmma_mm(a, b):
    """a @ b through day87_fast::wmma_mm: the lesson's wmma_mm, tuned."""
    op.check_tensors("day87_fast::wmma_mm", a, b)
    return torch.ops.day87_fast.wmma_mm(a, b)


def wmma_mm_bias(a, b, bias):
    """a @ b + bias through day87_fast::wmma_mm_bias, the bias added in the kernel's
    store: float16 a, b and float32 bias in, float32 out on CUDA; float64 on the CPU."""
    op.check_tensors("day87_fast::wmma_mm_bias", a, b)
    return torch.ops.day87_fast.wmma_mm_bias(a, b, bias)


def _fake(a, b):
    op.check_matrices("day87_fast::wmma_mm", a, b)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=op.accumulate_dtype(a.dtype))


def _fake_bias(a, b, bias):
    # fast/csrc/binding.cpp's rules in its order: the bias's device, a and b's rules, then
    # the bias's shape and dtype (its contiguity, like a and b's, is not the fake's
    # to check: a fake tensor's strides under compile need not be eager's).
    op_name = "day87_fast::wmma_mm_bias"
    torch._check(bias.device == a.device, lambda: (
        f"{op_name}: rule 'one device': bias must be on a's device; "
        f"got a: {op.described(a)}, bias: {op.described(bias)}"))
    op.check_matrices(op_name, a, b)
    torch._check(bias.dim() == 1 and bias.shape[0] == b.shape[1], lambda: (
        f"{op_name}: rule 'bias': bias must be 1-D with one value per column of b; "
        f"got bias: {op.described(bias)}, b: {op.described(b)}"))
    torch._check(bias.dtype == op.accumulate_dtype(a.dtype), lambda: (
        f"{op_name}: rule 'dtype': on {bias.device} bias must be "
        f"{op.scalar_type(op.accumulate_dtype(a.dtype))}; "
        f"got bias: {op.described(bias)}"))
    return a.new_empty((a.shape[0], b.shape[1]), dtype=op.accumulate_dtype(a.dtype))


def _backward(ctx, grad):
    # Grad mode is on in a backward only under create_graph=True (a gradient penalty,
    # a Hessian-vector product): then the formula must itself be differentiable, and
    # the lesson's two matmuls are. So is the float64 path.
    if not grad.is_cuda or torch.is_grad_enabled():
        return op._backward(ctx, grad)
    # The same two products on tensor cores, in one call: fast/csrc/binding.cpp's
    # wmmaMmBackwardCuda. It returns None where that gradient is not wanted (the
    # lesson's _setup_context saved only the partner of each wanted gradient).
    a, b = ctx.saved_tensors
    return torch.ops.day87_fast.wmma_mm_backward(grad, a, b)


def _fake_backward(grad, a, b):
    # wmma_mm_backward's output metadata, for torch.compile's trace of the backward:
    # grad_a where b is given, grad_b where a is given, FP16 like the inputs.
    return (grad.new_empty((grad.shape[0], b.shape[0]), dtype=b.dtype) if b is not None else None,
            grad.new_empty((a.shape[1], grad.shape[1]), dtype=a.dtype) if a is not None else None)


def _setup_context_bias(ctx, inputs, output):
    # grad_a and grad_b need what wmma_mm's need; grad_bias needs no saved value.
    op._setup_context(ctx, inputs[:2], output)


def _backward_bias(ctx, grad):
    grad_a, grad_b = _backward(ctx, grad)
    # bias[j] is added to every row of column j with derivative 1, so its gradient
    # is grad summed down the rows, in grad's own dtype (FP32 on CUDA: an FP16 sum
    # of 8192 rows of gradients near 10 would pass FP16's largest value).
    grad_bias = grad.sum(0) if ctx.needs_input_grad[2] else None
    return grad_a, grad_b, grad_bias


def _register():
    """The registrations that live in Python, run once the library is loaded."""
    library = torch.library.Library(NAMESPACE, "FRAGMENT")
    torch.library.register_fake("day87_fast::wmma_mm", _fake, lib=library)
    torch.library.register_autograd("day87_fast::wmma_mm", _backward,
                                    setup_context=op._setup_context, lib=library)
    torch.library.register_fake("day87_fast::wmma_mm_backward", _fake_backward, lib=library)
    torch.library.register_fake("day87_fast::wmma_mm_bias", _fake_bias, lib=library)
    torch.library.register_autograd("day87_fast::wmma_mm_bias", _backward_bias,
                                    setup_context=_setup_context_bias, lib=library)
    return library


# ===========================================================================
# The build: the lesson's, with this folder's sources and cuBLAS's headers.
# ===========================================================================
# fast/csrc/binding.cpp gets PyTorch's cuBLAS handle from ATen/cuda/CUDAContext.h, which
# includes these. A full toolkit has them; a minimal one (nvcc, the runtime) does not.
LIBRARY_HEADERS = ("cublas_v2.h", "cublasLt.h", "cusparse.h", "cusolverDn.h")


def library_header_folders(toolkit):
    """Where LIBRARY_HEADERS come from: none beyond the toolkit's own where it has
    them all, else the folders of the nvidia wheels that torch itself installed
    (the headers of the very cuBLAS it loads), or None where some are nowhere.
    The compile searches them after every other folder, so that no header of the
    toolkit's own is shadowed."""
    def have(folder, header):
        return os.path.exists(os.path.join(folder, header))

    searched = [os.path.join(toolkit["home"], "include")] + toolkit["include"]
    if all(any(have(folder, header) for folder in searched) for header in LIBRARY_HEADERS):
        return []
    try:
        import nvidia  # the namespace package that torch's CUDA wheels install into
        wheels = sorted({os.path.join(root, name, "include") for root in nvidia.__path__
                         for name in os.listdir(root)})
    except ImportError:
        wheels = []
    folders = [folder for folder in wheels
               if any(have(folder, header) for header in LIBRARY_HEADERS)]
    found = all(any(have(folder, header) for folder in folders) for header in LIBRARY_HEADERS)
    return folders if found else None


def _refuse_without_library_headers(toolkit):
    """Before compiling: refuse a toolkit where cuBLAS's headers are nowhere, naming what
    to install."""
    if toolkit and library_header_folders(toolkit) is None:
        raise RuntimeError(
            "day87: fast/csrc/binding.cpp needs cuBLAS's headers "
            f"({', '.join(LIBRARY_HEADERS)}, through "
            f"ATen/cuda/CUDAContext.h), and neither {toolkit['home']}/include nor torch's "
            "nvidia wheels have them all: this toolkit is a minimal one. Fix: install the full "
            f"CUDA {torch.version.cuda} toolkit and set CUDA_HOME to it"
            + (f', or pip install "cuda-toolkit[cublas,cusolver,cusparse]=={torch.version.cuda}.*" '
               "(wheels that a CUDA 13 torch itself depends on)"
               if int(torch.version.cuda.split(".")[0]) >= 13 else "") + ".")


def _header_flags(toolkit):
    folders = library_header_folders(toolkit) if toolkit else []
    # No -lcublas: the library links libtorch_cuda, which links the cuBLAS that torch
    # loaded, and fast/csrc/binding.cpp's cuBLAS calls resolve to that one.
    return [f"-idirafter{folder}" for folder in folders or []]


# The Hopper kernels (versions 2 to 4) use wgmma, which nvcc accepts only for the sm_90a
# target, and no architecture list that torch derives names it: "9.0" builds plain
# sm_90. cpp_extension writes "9.0a" as -gencode=arch=compute_90a,code=sm_90a (the
# -arch=sm_90a shorthand has been seen to run a plain sm_90 pass too, which rejects
# wgmma). It goes in the architecture list, not in nvcc's flags: a flag that names an
# architecture makes cpp_extension drop the list's own (seen: a library of sm_90a alone).
HOPPER_ARCHITECTURE = "9.0a"


def hopper_architectures(archs):
    """(HOPPER_ARCHITECTURE,) where this build may run on a Hopper card, else (). `archs`:
    the lesson's architecture list, which names 9.0 where such a card is visible, where
    no card is, or where TORCH_CUDA_ARCH_LIST asks for it. A list without 9.0 was asked
    for (the T4's 7.5+PTX, say): its code is what runs. CUDA 12 is the first with sm_90a;
    op.py builds only with an nvcc of torch's own CUDA major version."""
    names = [name.split("+")[0] for name in (archs or "").replace(" ", ";").split(";")]
    if (int((torch.version.cuda or "0").split(".")[0]) < 12 or HOPPER_ARCHITECTURE in names
            or "9.0" not in names):
        return ()  # no such target, a list that has it already, or no Hopper card to run it
    return (HOPPER_ARCHITECTURE,)


def build_and_load():
    """The lesson's build (op.py) with this folder's sources, cuBLAS's headers and sm_90a:
    the toolkit, the key, one cpp_extension.load on a cold cache, the library loaded."""
    toolkit = op.find_toolkit()
    cuda_sources = (["launch_policy.cu", "backward_version1_scaled.cu",
                     "backward_version2_one_launch.cu"] if toolkit else [])
    sources = [os.path.join(SOURCES, name) for name in cuda_sources + ["binding.cpp"]]
    archs = op.architectures() if toolkit else None
    archs = ";".join([archs, *hopper_architectures(archs)]) if toolkit else None
    # The headers that launch_policy.cu includes are in the key: an edit there rebuilds this.
    directory = op.keyed_directory(NAMESPACE, sources + HEADERS, archs)
    library = os.path.join(directory, f"{NAMESPACE}_ext.so")
    op.refuse_another_copy(NAMESPACE, __file__, library)
    if not op.built(library):
        _refuse_without_library_headers(toolkit)
        with op.preparing_build(library, sources, toolkit, archs) as (cpp_extension, flags):
            cpp_extension.load(
                name=f"{NAMESPACE}_ext", sources=sources, build_directory=directory,
                extra_cflags=["-O2", *_header_flags(toolkit)]
                + ["-DDAY87_WITH_CUDA"] * bool(toolkit),
                # -lineinfo lets compute-sanitizer name the kernels' lines.
                extra_cuda_cflags=["-O3", "-lineinfo"],
                extra_include_paths=flags["include"], extra_ldflags=flags["link"],
                is_python_module=False)  # binding.cpp's TORCH_LIBRARY blocks register at load
    op.load_library(library, sources)
    return {"directory": directory, "library": library, "archs": archs, "toolkit": toolkit,
            "with_cuda": toolkit is not None, "cuda_home": toolkit and toolkit["home"]}


BUILD = build_and_load()
_registrations = op.register_once(NAMESPACE, __file__, _register, globals().get("_registrations"))
