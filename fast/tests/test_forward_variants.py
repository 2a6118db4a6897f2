"""pytest: forward_variants.py's variants still name version 1's plans and still compile
(no GPU needed).

    cd fast && python -m pytest -q tests/test_forward_variants.py

Each variant is a plan of fast/csrc/version1_wmma.cuh selected by its template parameter,
launched through that file's own launchPlan or its kernel alone: a plan renamed or a
launcher whose parameters changed must fail here, where nvcc compiles the generated
calls, not on the GPU.
"""
import os
import re
import subprocess

import pytest

from bench import forward_variants

NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
FAST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH, SOURCES = os.path.join(FAST, "bench"), os.path.join(FAST, "csrc")


def test_every_timing_function_it_calls_exists():
    """forward_variants.py times with bench.py's baseline and timing.py's functions,
    on a GPU only: a name that either file no longer defines fails here, on any machine."""
    with open(forward_variants.__file__) as file:
        source = file.read()
    for module in ("bench", "timing"):
        with open(os.path.join(BENCH, f"{module}.py")) as file:
            defined = set(re.findall(r"^def (\w+)", file.read(), re.MULTILINE))
        called = set(re.findall(rf"\b{module}\.(\w+)\(", source))
        assert called and called <= defined, f"{module}.py lacks {sorted(called - defined)}"


def test_one_variant_is_wrong_on_purpose():
    """The check column is seen to fail on a variant made wrong on purpose."""
    assert [name for name, (_, how) in forward_variants.VARIANTS.items()
            if how == forward_variants.LAST_STAGE_DROPPED and "must fail" in name]


def compile_variants(variants, folder):
    """nvcc -c the generated calls for one architecture."""
    source = folder / "variants.cu"
    source.write_text(forward_variants.variants_source(variants))
    return subprocess.run([NVCC, "-c", "-O0", "-gencode", "arch=compute_80,code=sm_80",
                           "-I", SOURCES, "-o", str(folder / "variants.o"), str(source)],
                          capture_output=True, text=True)


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_generated_calls_compile(tmp_path):
    result = compile_variants(forward_variants.VARIANTS, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_a_plan_that_is_not_there_does_not_compile(tmp_path):
    """The compile above can fail: a plan version1_wmma.cuh does not define."""
    result = compile_variants({"a plan that lost": ("WidePlan", forward_variants.PLAN)}, tmp_path)
    assert result.returncode != 0 and "WidePlan" in result.stderr
