"""fast/setup.py: builds day87_fast ahead of time, into one wheel on the LibTorch stable ABI.

    pip install torch ninja "setuptools>=70.1"          # first: the build compiles against them
    pip install --no-build-isolation ./fast             # built and installed
    pip wheel --no-build-isolation --no-deps ./fast     # the wheel alone: every architecture
    TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e ./fast   # to develop

The build compiles against the torch that will run it, so it runs with --no-build-isolation:
an isolated build (pip install ./fast) has a temporary environment with no torch of yours,
and is refused with that fix. The CUDA toolkit is found as the lesson's op.py finds it, and
must be of torch's CUDA major version; without one, or with another, nothing compiles.

The wheel holds two libraries, each fast/csrc/binding.cpp compiled with TORCH_TARGET_VERSION
2.11 (only the stable ABI's headers, and AOTInductor's C shim, compile then):
- _library_cuda: with the kernels of fast/csrc, for a torch built with CUDA. Machine code for
  sm_75 to sm_90, sm_90a for the Hopper kernel (version 3), PTX of compute_90;
- _library_cpu: the float64 CPU reference alone, for a torch built without CUDA.
TORCH_CUDA_ARCH_LIST replaces the architecture list; a list naming 9.0 gets 9.0a too.
"""

import contextlib
import glob
import json
import os
import pathlib
import re
import shlex
import shutil
import subprocess
import sys

import setuptools

INSTALL_FIRST = 'pip install torch ninja "setuptools>=70.1"'
# pip builds a wheel through setuptools' bdist_wheel, which setuptools holds from 70.1 on; an
# older one borrowed it from the wheel package, which no longer has it from wheel 0.46 on.
if tuple(map(int, setuptools.__version__.split(".")[:2])) < (70, 1):
    raise SystemExit(f"day87_fast: setuptools {setuptools.__version__} is older than 70.1, "
                     "the first that builds a wheel by itself. Fix: " + INSTALL_FIRST)
try:
    import torch
except ImportError:
    raise SystemExit("day87_fast: no torch to build against in this build's Python: the build "
                     "compiles against the torch that will run it, which an isolated build "
                     "(pip install ./fast) cannot see. Fix: " + INSTALL_FIRST + ", then "
                     "pip install --no-build-isolation ./fast") from None
from torch.utils import cpp_extension  # noqa: E402  after torch's refusal

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "csrc")
CUDA_SOURCES = ["launch_policy.cu", "backward_version1_scaled.cu"]
# The oldest torch the wheel loads in, as TORCH_TARGET_VERSION writes a version: one byte
# each for major, minor and patch, then five of ABI tag. 2.11 is the oldest torch whose
# PyPI build (CUDA 13.0) matches the nvcc 13 that builds this wheel.
TORCH_FLOOR = "2.11"
TORCH_TARGET_VERSION = "0x020b000000000000"
# Every card from the T4 up, and PTX of the newest that the driver compiles for later ones.
ARCHITECTURES = "7.5;8.0;8.6;8.9;9.0+PTX"
# The Hopper kernels use wgmma, which exists only in sm_90a code. cpp_extension writes
# "9.0a" as -gencode=arch=compute_90a,code=sm_90a; it goes in the list, not in nvcc's flags:
# a flag that names an architecture makes cpp_extension drop the list's own.
HOPPER_ARCHITECTURE = "9.0a"


def hopper_architectures(archs):
    """(HOPPER_ARCHITECTURE,) where a list names plain 9.0 and not 9.0a, else (): a list
    without 9.0 (the T4's 7.5+PTX, say) was asked for, and its code is what runs."""
    names = [name.split("+")[0] for name in archs.replace(" ", ";").split(";")]
    return (HOPPER_ARCHITECTURE,) if "9.0" in names and HOPPER_ARCHITECTURE not in names else ()


def architectures():
    archs = os.environ.get("TORCH_CUDA_ARCH_LIST") or ARCHITECTURES
    return ";".join([archs, *hopper_architectures(archs)])


# ---- The CUDA toolkit: found as the lesson's op.py finds it ----------------------
# torch's own guess (cpp_extension.CUDA_HOME, made as it is imported) is the folder above the
# nvcc on PATH: where that nvcc is a wrapper script (/usr/local/bin/nvcc), /usr/local, which
# holds no headers. find_toolkit and toolkit_fix are op.py's, copied (the lesson may not
# import fast/, nor fast/ the lesson at build time); tests/test_install.py holds them equal.
def find_toolkit():  # CUDA_HOME or CUDA_PATH; pip's nvidia/cuN; above nvcc's; /usr/local/cuda
    if not torch.version.cuda:
        return None
    chosen = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    major, parts = torch.version.cuda.split(".")[0], []
    with contextlib.suppress(ImportError):
        import nvidia  # pip's cuda-toolkit: nvidia/cu13 in one or more site-packages
        parts = [] if chosen else [os.path.join(root, f"cu{major}") for root in nvidia.__path__]
    if homes := [part for part in parts if os.path.exists(f"{part}/bin/nvcc")]:
        # libcudart.so.13, no libcudart.so for -lcudart
        cudart = [f"{part}/lib/libcudart.so.{major}" for part in parts]
        return {"home": homes[0], "cudart": next(filter(os.path.exists, cudart), None),
                "include": [f"{part}/include" for part in parts]}
    nvcc = shutil.which("nvcc")
    for home in [chosen] if chosen else [
            nvcc and os.path.dirname(os.path.dirname(os.path.realpath(nvcc))), "/usr/local/cuda"]:
        if home and all(os.path.exists(f"{home}/{part}") for part in
                        ("bin/nvcc", "include/cuda_runtime.h")):
            return {"home": home, "include": [], "cudart": None}


def toolkit_fix():  # PyPI's CUDA 12 wheels carry no nvcc
    return (f'pip install "cuda-toolkit[nvcc,cccl]=={torch.version.cuda}.*"' if
            torch.version.cuda >= "13" else f"CUDA_HOME=(a CUDA {torch.version.cuda} toolkit)")


def named_toolkit():  # "CUDA_HOME" or "CUDA_PATH" where set: find_toolkit looks there alone
    return next((name for name in ("CUDA_HOME", "CUDA_PATH") if os.environ.get(name)), None)


def where_searched():
    """Where find_toolkit looked and found nothing, in its order, for the refusal to name."""
    if name := named_toolkit():
        return f"{name}={os.environ[name]} holds no bin/nvcc and include/cuda_runtime.h"
    nvcc = shutil.which("nvcc")
    on_path = (f"the nvcc on PATH, {nvcc}, is in no toolkit's bin folder" if nvcc
               else "no nvcc on PATH")
    return (f"CUDA_HOME and CUDA_PATH are unset, no pip toolkit holds "
            f"nvidia/cu{torch.version.cuda.split('.')[0]}/bin/nvcc, {on_path}, and "
            "/usr/local/cuda holds none")


def nvcc_release(home):
    """The CUDA release ("13.0") that `home`'s nvcc says it is, or None where it says none."""
    with contextlib.suppress(OSError):  # an nvcc that does not run says none
        shown = subprocess.run([f"{home}/bin/nvcc", "--version"], capture_output=True,
                               text=True).stdout
        if found := re.search(r"release (\d+\.\d+)", shown):
            return found[1]
    return None


def use_toolkit():
    """find_toolkit's toolkit, made cpp_extension's (and the environment's CUDA_HOME) before
    any extension is made; None for a torch built without CUDA. No toolkit, or one whose nvcc
    is of another CUDA major version than torch's, is refused here, before anything compiles:
    a library built with CUDA 12 needs libcudart.so.12, which a CUDA 13 torch does not bring."""
    if not torch.version.cuda:
        return None
    major, named = torch.version.cuda.split(".")[0], named_toolkit()
    # The fix: another folder where one is named; else what find_toolkit looks at first.
    fix = f"{named}=(the folder of a CUDA {major} toolkit)" if named else toolkit_fix()
    toolkit = find_toolkit()
    if toolkit is None:
        raise SystemExit(f"day87_fast: torch {torch.__version__} is built with CUDA "
                         f"{torch.version.cuda}, and no CUDA toolkit is found: "
                         f"{where_searched()}. Fix: {fix}")
    home, release = toolkit["home"], nvcc_release(toolkit["home"])
    if release is None or release.split(".")[0] != major:
        said = f"CUDA {release}" if release else "no CUDA release (nvcc --version)"
        other = f", or a torch built with CUDA {release.split('.')[0]}" if release else ""
        raise SystemExit(f"day87_fast: the CUDA toolkit in {home} has nvcc of {said}, and "
                         f"torch {torch.__version__} is built with CUDA {torch.version.cuda}: "
                         f"a library built with one major version does not load beside the "
                         f"other's. Fix: {fix}{other}")
    if home != cpp_extension.CUDA_HOME:  # torch's guess, said as it was imported
        print(f"day87_fast: the CUDA toolkit in {home} (nvcc {release}), not torch's guess "
              f"{cpp_extension.CUDA_HOME}", file=sys.stderr)
    os.environ["CUDA_HOME"] = cpp_extension.CUDA_HOME = home
    return toolkit


# ---- The compiler: one that links libstdc++ as a shared library -------------
# A library that carries its own copy of libstdc++ beside the libstdc++.so.6 that torch
# loaded crashes Python at the first message that streams a number (checks/NOTES.md:
# checks/torch_check_probe.py reproduces it). Some images' CXX links it statically. The probe,
# needs_libstdcxx and needed_libraries, is op.py's, copied; tests/test_install.py holds it equal.
def needs_libstdcxx(compiler):  # None: the compiler links no probe, or no readelf reads it
    import tempfile
    with tempfile.TemporaryDirectory() as folder:
        source = pathlib.Path(folder, "probe.cpp")
        source.write_text("#include <sstream>\n"
                          "std::string f(long n) { std::ostringstream s; s << n; return s.str(); }")
        with contextlib.suppress(OSError):  # no such compiler, or no readelf
            if subprocess.run([*shlex.split(compiler), "-shared", "-fPIC", source, "-o",
                               f"{folder}/probe.so"], capture_output=True).returncode == 0:
                return "libstdc++.so.6" in needed_libraries(f"{folder}/probe.so")


def needed_libraries(path):  # as `readelf -d` lists them (binutils, beside the linker)
    shown = subprocess.run(["readelf", "-d", path], capture_output=True, text=True).stdout
    return re.findall(r"\(NEEDED\).*\[(.*)\]", shown)


def choose_compiler():
    """CXX (else c++) where it links libstdc++.so.6; else /usr/bin/g++, said in one line;
    else refuse. CC follows, since cpp_extension hands nvcc's -ccbin the C compiler."""
    compiler = os.environ.get("CXX", "c++")
    if needs_libstdcxx(compiler) is not False:
        return {}  # it does, or it links nothing and the build will say why
    if not needs_libstdcxx("/usr/bin/g++"):
        raise SystemExit(f"day87_fast: {compiler} links libstdc++ statically, and so does (or "
                         "is missing) /usr/bin/g++: the first error message would crash "
                         "Python. Fix: CXX=(a compiler that links libstdc++.so.6)")
    print(f"day87_fast: {compiler} links libstdc++ statically; building with /usr/bin/g++",
          file=sys.stderr)
    return {"CXX": "/usr/bin/g++", "CC": "/usr/bin/g++"}


# ---- cuBLAS: the backward's products -----------------------------------------
def cublas_folders():
    """The folders of cublas_v2.h and of the cuBLAS library to link: the toolkit's, else
    those of the nvidia wheels that torch itself installed (the very cuBLAS it loads)."""
    major = torch.version.cuda.split(".")[0]
    roots = [os.path.join(cpp_extension.CUDA_HOME, part) for part in ("include", "lib64")]
    try:
        import nvidia  # the namespace package of torch's CUDA wheels
        roots += [os.path.join(root, name, part) for root in nvidia.__path__
                  for name in sorted(os.listdir(root)) for part in ("include", "lib")]
    except ImportError:
        pass
    header = next((root for root in roots if os.path.exists(f"{root}/cublas_v2.h")), None)
    library = next((f"{root}/{name}" for root in roots for name in
                    ("libcublas.so", f"libcublas.so.{major}") if os.path.exists(f"{root}/{name}")),
                   None)
    if not (header and library):
        raise SystemExit("day87_fast: fast/csrc/binding.cpp's backward needs cuBLAS "
                         f"(cublas_v2.h and libcublas), found in neither {roots[0]} nor torch's "
                         "nvidia wheels. Fix: pip install "
                         f"\"nvidia-cublas=={torch.version.cuda}.*\"")
    return header, library


# ---- The two libraries ----------------------------------------------------------
def extensions(toolkit):
    """The CPU library, and with `toolkit` (use_toolkit's) the CUDA library."""
    stable = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]
    cpu = cpp_extension.CppExtension(
        "day87_fast._library_cpu", [os.path.join("csrc", "binding.cpp")],
        extra_compile_args={"cxx": ["-O2", *stable]}, py_limited_api=True)
    if toolkit is None:
        return [cpu]
    header, library = cublas_folders()
    # USE_CUDA: the stable ABI's C header declares the CUDA functions (the current stream,
    # PyTorch's cuBLAS handle) only under it.
    cuda_flags = [*stable, "-DUSE_CUDA", "-DDAY87_WITH_CUDA"]
    cuda = cpp_extension.CUDAExtension(
        "day87_fast._library_cuda",
        [os.path.join("csrc", name) for name in CUDA_SOURCES + ["binding.cpp"]],
        include_dirs=toolkit["include"],  # pip's toolkit: its headers in every site-packages
        extra_compile_args={"cxx": ["-O2", *cuda_flags, f"-idirafter{header}"],
                            # -lineinfo lets compute-sanitizer name the kernels' lines
                            "nvcc": ["-O3", "-lineinfo", *cuda_flags]},
        # by path: pip's wheel has only libcublas.so.13, which -lcublas does not find
        extra_link_args=[library],
        depends=sorted(glob.glob(os.path.join(SOURCES, "*.cuh"))), py_limited_api=True)
    return [cuda, cpu]


class BuildWithFacts(cpp_extension.BuildExtension):
    """The build, then build.json beside the libraries: what they were built for, which
    day87_fast.BUILD reports. `cudart`: pip's toolkit's libcudart.so.13, or None."""

    def __init__(self, *args, cudart=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.cudart = cudart

    def build_extensions(self):
        if self.cudart:  # pip's toolkit has no libcudart.so for -lcudart: a link, as op.py makes
            folder = os.path.join(self.build_temp, "cudart")
            os.makedirs(folder, exist_ok=True)
            link = os.path.join(folder, "libcudart.so")
            with contextlib.suppress(FileNotFoundError):  # a link from an earlier build
                os.remove(link)
            os.symlink(self.cudart, link)
            for extension in self.extensions:
                extension.library_dirs.append(folder)
        super().build_extensions()

    def run(self):
        super().run()
        folder = os.path.dirname(self.get_ext_fullpath("day87_fast._library_cpu"))
        facts = {"architectures": architectures() if torch.version.cuda else None,
                 "built_with_torch": torch.__version__, "cuda": torch.version.cuda,
                 "torch_floor": TORCH_FLOOR}
        with open(os.path.join(folder, "build.json"), "w") as file:
            json.dump(facts, file, indent=1)


def package_version():
    """day87_fast.__version__, read from its source: importing it would load a library that
    this build has yet to make."""
    source = pathlib.Path(HERE, "src", "day87_fast", "__init__.py").read_text()
    return re.search(r'^__version__ = "([^"]+)"', source, re.MULTILINE)[1]


if __name__ == "__main__":
    os.environ.update(choose_compiler())
    os.environ["TORCH_CUDA_ARCH_LIST"] = architectures()
    toolkit = use_toolkit()  # before extensions(): CUDAExtension takes its folders from it
    setuptools.setup(
        name="day87_fast",
        version=package_version(),
        description="Day 88's operator: the lesson's WMMA matrix multiply, made fast",
        package_dir={"": "src"},
        packages=["day87_fast"],
        ext_modules=extensions(toolkit),
        install_requires=[f"torch>={TORCH_FLOOR}", "numpy"],  # numpy: torch warns without it
        python_requires=">=3.9",
        cmdclass={"build_ext": BuildWithFacts.with_options(
            use_ninja=True, cudart=toolkit and toolkit["cudart"])},
        # abi3: one wheel for every CPython from 3.9 on (no library here uses Python's C API)
        options={"bdist_wheel": {"py_limited_api": "cp39"}},
    )
