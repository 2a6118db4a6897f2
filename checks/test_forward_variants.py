"""pytest: forward_variants.py's source edits still apply to kernel.cu (no GPU needed).

Each variant is kernel.cu's own text with named edits; an edit whose text kernel.cu
no longer holds must stop the tool with its name, not time an unedited kernel.
"""
import shutil

import pytest

import forward_variants


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
