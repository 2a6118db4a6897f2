"""pytest: forward_variants.py still applies to kernel.cu and still compiles (no GPU needed).

Each variant is kernel.cu's own text with named edits; an edit whose text kernel.cu
no longer holds must stop the tool with its name, not time an unedited kernel, and
the generated calls must still match kernel.cu's plan launcher (nvcc compiles them).
"""
import os
import shutil
import subprocess

import pytest

import forward_variants

NVCC = os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc")


@pytest.mark.parametrize("name", list(forward_variants.VARIANTS))
def test_every_variant_applies(name):
    plan, edits = forward_variants.VARIANTS[name]
    source = forward_variants.variant_source(0, edits)
    assert source.startswith("namespace variant0 {")
    for what, old, new in edits:
        assert new in source, what


def test_a_stale_edit_is_named(tmp_path):
    shutil.copy(f"{forward_variants.LESSON}/kernel.cu", tmp_path / "kernel.cu")
    text = (tmp_path / "kernel.cu").read_text()
    what, old, _ = forward_variants.PRELOAD_B
    (tmp_path / "kernel.cu").write_text(text.replace(old, "// edited away\n"))
    with pytest.raises(SystemExit, match=what):
        forward_variants.variant_source(0, [forward_variants.PRELOAD_B], lesson=str(tmp_path))


def compile_variants(lesson, folder):
    """nvcc -c the generated variants (two: one plain, one with edits) for one architecture."""
    names = ["SquarePlan 128x128, 3 x 32", "square, B preloaded"]
    source = folder / "variants.cu"
    source.write_text(forward_variants.variants_source({name: forward_variants.VARIANTS[name] for name in names},
                                                       lesson=lesson))
    return subprocess.run([NVCC, "-c", "-O0", "-gencode", "arch=compute_80,code=sm_80", "-o",
                           str(folder / "variants.o"), str(source)], capture_output=True, text=True)


@pytest.mark.skipif(not os.path.exists(NVCC), reason="no nvcc")
def test_the_generated_calls_compile(tmp_path):
    result = compile_variants(forward_variants.LESSON, tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
