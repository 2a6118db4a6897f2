"""pytest: forward_variants.py still applies to fast/kernel.cu and still compiles (no GPU needed).

    python -m pytest -q fast/test_forward_variants.py

Each variant is fast/kernel.cu's own text with named edits; an edit whose text the
kernel no longer holds must stop the tool with its name, not time an unedited kernel,
and the generated calls must still match fast/kernel.cu's plan launcher and the
lesson's kernel.cu that it includes (nvcc compiles them).
"""
import os
import re
import shutil
import subprocess
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import forward_variants  # noqa: E402

NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")
FAST = os.path.dirname(os.path.abspath(__file__))


def test_every_timing_function_it_calls_exists():
    """forward_variants.py times with bench.py's baseline and timing.py's functions,
    on a GPU only: a name that either file no longer defines fails here, on any machine."""
    with open(forward_variants.__file__) as file:
        source = file.read()
    for module in ("bench", "timing"):
        with open(os.path.join(FAST, f"{module}.py")) as file:
            defined = set(re.findall(r"^def (\w+)", file.read(), re.MULTILINE))
        called = set(re.findall(rf"\b{module}\.(\w+)\(", source))
        assert called and called <= defined, f"{module}.py lacks {sorted(called - defined)}"


@pytest.mark.parametrize("name", list(forward_variants.VARIANTS))
def test_every_variant_applies(name):
    plan, edits = forward_variants.VARIANTS[name]
    source = forward_variants.variant_source(0, edits)
    assert source.startswith("namespace variant0 {")
    assert "#include" not in source and forward_variants.OPENER not in source
    for what, old, new in edits:
        assert new in source, what


def test_a_stale_edit_is_named(tmp_path):
    shutil.copy(os.path.join(forward_variants.FAST, "kernel.cu"), tmp_path / "kernel.cu")
    text = (tmp_path / "kernel.cu").read_text()
    what, old, _ = forward_variants.PRELOAD_B
    (tmp_path / "kernel.cu").write_text(text.replace(old, "// edited away\n"))
    with pytest.raises(SystemExit, match=what):
        forward_variants.variant_source(0, [forward_variants.PRELOAD_B], fast=str(tmp_path))


def test_the_lesson_kernel_comes_once_outside_every_namespace():
    source = forward_variants.variants_source({name: forward_variants.VARIANTS[name] for name in
                                               ["SquarePlan 128x128, 3 x 32", "square, B preloaded"]})
    with open(os.path.join(forward_variants.LESSON, "kernel.cu")) as lesson:
        lesson_text = lesson.read()
    assert source.count(lesson_text) == 1
    assert source.index(lesson_text) < source.index("namespace variant0 {")


def compile_variants(fast, folder):
    """nvcc -c the generated variants (two: one plain, one with edits) for one architecture."""
    names = ["SquarePlan 128x128, 3 x 32", "square, B preloaded"]
    source = folder / "variants.cu"
    source.write_text(forward_variants.variants_source({name: forward_variants.VARIANTS[name] for name in names},
                                                       fast=fast))
    return subprocess.run([NVCC, "-c", "-O0", "-gencode", "arch=compute_80,code=sm_80", "-o",
                           str(folder / "variants.o"), str(source)], capture_output=True, text=True)


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_generated_calls_compile(tmp_path):
    result = compile_variants(forward_variants.FAST, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
