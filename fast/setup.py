"""fast/setup.py: builds day87_fast ahead of time, into one wheel on the LibTorch stable ABI.

    pip wheel --no-build-isolation --no-deps ./fast    # the wheel: every architecture
    pip install --no-build-isolation ./fast             # built and installed
    TORCH_CUDA_ARCH_LIST=9.0 pip install --no-build-isolation -e ./fast   # to develop

--no-build-isolation builds against the torch already installed (setuptools 64 or later,
wheel and ninja must be there too), instead of downloading another into a build environment.
Either way the wheel runs under any torch from 2.11 on.

The wheel holds two libraries, each fast/csrc/binding.cpp compiled with TORCH_TARGET_VERSION
2.11 (only the stable ABI's headers compile then):
- _library_cuda: with the kernels of fast/csrc, for a torch built with CUDA. Machine code for
  sm_75 to sm_90, sm_90a for the Hopper kernel (version 3), PTX of compute_90;
- _library_cpu: the float64 CPU reference alone, for a torch built without CUDA.
TORCH_CUDA_ARCH_LIST replaces the architecture list; a list naming 9.0 gets 9.0a too.
"""

import glob
import json
import os
import shlex
import subprocess
import sys
import tempfile

import torch
from setuptools import setup
from torch.utils import cpp_extension

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


# ---- The compiler: one that links libstdc++ as a shared library -------------
# A library that carries its own copy of libstdc++ beside the libstdc++.so.6 that torch
# loaded crashes Python at the first message that streams a number (checks/NOTES.md:
# checks/torch_check_probe.py reproduces it). Some images' CXX links it statically.
PROBE = ("#include <sstream>\n"
         "std::string f(long n) { std::ostringstream s; s << n; return s.str(); }")


def needs_shared_libstdcxx(compiler):
    """Whether a library that `compiler` links needs libstdc++.so.6; None where it links
    none (no such compiler). readelf is binutils', which every compiler here links with."""
    with tempfile.TemporaryDirectory() as folder:
        source, library = os.path.join(folder, "probe.cpp"), os.path.join(folder, "probe.so")
        with open(source, "w") as file:
            file.write(PROBE)
        try:
            linked = subprocess.run([*shlex.split(compiler), "-shared", "-fPIC", source, "-o",
                                     library], capture_output=True)
        except OSError:
            return None
        if linked.returncode != 0:
            return None
        dynamic = subprocess.run(["readelf", "-d", library], capture_output=True, text=True)
        return "libstdc++.so.6" in dynamic.stdout


def choose_compiler():
    """CXX (else c++) where it links libstdc++.so.6; else /usr/bin/g++, said in one line;
    else refuse. CC follows, since cpp_extension hands nvcc's -ccbin the C compiler."""
    compiler = os.environ.get("CXX", "c++")
    if needs_shared_libstdcxx(compiler) is not False:
        return {}  # it does, or it links nothing and the build will say why
    if not needs_shared_libstdcxx("/usr/bin/g++"):
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
def extensions():
    stable = [f"-DTORCH_TARGET_VERSION={TORCH_TARGET_VERSION}"]
    cpu = cpp_extension.CppExtension(
        "day87_fast._library_cpu", [os.path.join("csrc", "binding.cpp")],
        extra_compile_args={"cxx": ["-O2", *stable]}, py_limited_api=True)
    if not torch.version.cuda:
        return [cpu]
    if cpp_extension.CUDA_HOME is None:
        raise SystemExit(f"day87_fast: torch {torch.__version__} is built with CUDA "
                         f"{torch.version.cuda}, and no CUDA toolkit is found. Fix: "
                         "CUDA_HOME=(the toolkit's folder), with nvcc of that major version")
    header, library = cublas_folders()
    # USE_CUDA: the stable ABI's C header declares the CUDA functions (the current stream,
    # PyTorch's cuBLAS handle) only under it.
    cuda_flags = [*stable, "-DUSE_CUDA", "-DDAY87_WITH_CUDA"]
    cuda = cpp_extension.CUDAExtension(
        "day87_fast._library_cuda",
        [os.path.join("csrc", name) for name in CUDA_SOURCES + ["binding.cpp"]],
        extra_compile_args={"cxx": ["-O2", *cuda_flags, f"-idirafter{header}"],
                            # -lineinfo lets compute-sanitizer name the kernels' lines
                            "nvcc": ["-O3", "-lineinfo", *cuda_flags]},
        # by path: pip's wheel has only libcublas.so.13, which -lcublas does not find
        extra_link_args=[library],
        depends=sorted(glob.glob(os.path.join(SOURCES, "*.cuh"))), py_limited_api=True)
    return [cuda, cpu]


class BuildWithFacts(cpp_extension.BuildExtension):
    """The build, then build.json beside the libraries: what they were built for, which
    day87_fast.BUILD reports."""

    def run(self):
        super().run()
        folder = os.path.dirname(self.get_ext_fullpath("day87_fast._library_cpu"))
        facts = {"architectures": architectures() if torch.version.cuda else None,
                 "built_with_torch": torch.__version__, "cuda": torch.version.cuda,
                 "torch_floor": TORCH_FLOOR}
        with open(os.path.join(folder, "build.json"), "w") as file:
            json.dump(facts, file, indent=1)


if __name__ == "__main__":
    os.environ.update(choose_compiler())
    os.environ["TORCH_CUDA_ARCH_LIST"] = architectures()
    setup(
        name="day87_fast",
        version="0.88.0",
        description="Day 88's operator: the lesson's WMMA matrix multiply, made fast",
        package_dir={"": "src"},
        packages=["day87_fast"],
        ext_modules=extensions(),
        install_requires=[f"torch>={TORCH_FLOOR}"],
        python_requires=">=3.9",
        cmdclass={"build_ext": BuildWithFacts.with_options(use_ninja=True)},
        # abi3: one wheel for every CPython from 3.9 on (no library here uses Python's C API)
        options={"bdist_wheel": {"py_limited_api": "cp39"}},
    )
