"""Loading: the library that fits this torch, once a process, or the reason it cannot load.

fast/setup.py's wheel holds two libraries, with build.json beside them: _library_cuda (the
CUDA kernels and the CPU reference) for a torch built with CUDA, _library_cpu (the float64
CPU reference alone) for a torch built without. What stops a library from loading is said
in the dynamic loader's own words, with what they mean here.
"""

import glob
import json
import os
import re
import shutil
import subprocess

import torch

NAMESPACE = "day87_fast"  # the operators' namespace, and the name of the package's folder
HERE = os.path.dirname(os.path.abspath(__file__))
INSTALL = "pip install --no-build-isolation ./fast"  # fast/setup.py's build, from the lesson


def library_path(kind):  # "cuda" or "cpu": _library_cuda.abi3.so, _library_cpu.abi3.so
    return next(iter(sorted(glob.glob(os.path.join(HERE, f"_library_{kind}.*so")))), None)


def major(cuda_version):  # "13.0" -> "13"
    return cuda_version.split(".")[0]


def load():
    """The CUDA library under a torch built with CUDA, else the CPU one; loaded once a
    process. Returns what was built and loaded: day87_fast.BUILD."""
    with_cuda = bool(torch.version.cuda) and library_path("cuda") is not None
    library = library_path("cuda" if with_cuda else "cpu")
    if library is None:
        raise ImportError(f"day87_fast: no library beside {HERE}/__init__.py: this is fast/src, "
                          f"not an installed package. Fix: {INSTALL} (or, to develop, "
                          f"{INSTALL.replace('./fast', '-e ./fast')})")
    with open(os.path.join(HERE, "build.json")) as facts:
        built = json.load(facts)
    # The CUDA library needs the CUDA runtime and cuBLAS of its build's major version
    # (libcudart.so.13); a torch of another brings its own, and the two do not mix.
    if with_cuda and major(built["cuda"]) != major(torch.version.cuda):
        raise ImportError(
            f"day87_fast: its CUDA library is built for CUDA {built['cuda']}, and torch "
            f"{torch.__version__} is built with CUDA {torch.version.cuda}: a library of one "
            f"CUDA major version does not load beside the other's. Fix: a torch built with "
            f"CUDA {major(built['cuda'])}, or day87_fast built against this torch: {INSTALL}, "
            f"with a CUDA {major(torch.version.cuda)} toolkit")
    refuse_another_copy(library)
    try:
        torch.ops.load_library(library)
    except OSError as error:
        raise ImportError(cannot_load(library, error, built)) from None
    return {"library": library, "with_cuda": with_cuda,
            "archs": built["architectures"] if with_cuda else None, **built}


def refuse_another_copy(library):
    """A namespace takes one library: a second STABLE_TORCH_LIBRARY(day87_fast) would abort
    the process. So a copy from another folder (an editable build beside an installed wheel)
    is refused while the first is loaded."""
    loaded = [path for path in torch.ops.loaded_libraries
              if os.path.basename(path).startswith("_library_")
              and os.path.basename(os.path.dirname(path)) == NAMESPACE]
    if loaded and os.path.realpath(library) not in loaded:
        raise ImportError(f"day87_fast: torch.ops.day87_fast is served by {loaded[0]}, not "
                          f"{library}. Fix: restart the Python process (the notebook kernel)")


def loader_reason(error):
    """The dynamic loader's own words, as ctypes.CDLL raised them: torch from 2.14 on wraps
    that OSError in one of its own ("Could not load this library"), which names no cause."""
    while error.__cause__ is not None:
        error = error.__cause__
    return str(error)


def cannot_load(library, error, built):
    """The loader's reason for `library`, and what it means here."""
    reason = loader_reason(error)
    if undefined := re.search(r"undefined symbol: (\S+)", reason):
        if torch.torch_version.TorchVersion(torch.__version__) < built["torch_floor"]:
            return (f"day87_fast: cannot load {library}: {reason}. torch {torch.__version__} "
                    f"lacks it: the wheel needs torch {built['torch_floor']} or later. Fix: "
                    f"pip install \"torch>={built['torch_floor']}\"")
        return (f"day87_fast: cannot load {library}: {reason}. Nothing loaded defines "
                f"{demangled(undefined[1])}: the build compiled no definition of it (a source "
                "missing from fast/setup.py's CUDA_SOURCES, or a declaration in "
                f"fast/csrc/binding.cpp that matches no definition). Fix: the sources, then "
                f"{INSTALL}")
    if missing := re.search(r"(\S+): cannot open shared object file", reason):
        holder = ""
        if missing[1].startswith("libcu") and built["cuda"]:  # libcudart.so.13, libcublas.so.13
            holder = f"a torch built with CUDA {built['cuda']}, whose CUDA wheels hold it, or "
        return (f"day87_fast: cannot load {library}: {reason}. The loader finds no "
                f"{missing[1]} where this process looks for libraries. Fix: {holder}"
                f"day87_fast built against this torch: {INSTALL}")
    return f"day87_fast: cannot load {library}: {reason}. Fix: {INSTALL}, against this torch"


def demangled(symbol):  # a C++ name as its source spells it, where binutils' c++filt is here
    if not shutil.which("c++filt"):
        return symbol
    shown = subprocess.run(["c++filt", symbol], capture_output=True, text=True).stdout.strip()
    return shown or symbol
