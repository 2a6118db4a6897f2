"""pytest: version 3 holds version 2's producer, consumers and epilogue unchanged, as both
files' openings say and as fast/README's `diff` of version 2's study against version 3
relies on (no GPU).

    cd fast && python -m pytest -q tests/test_hopper_versions.py
"""
import os

FAST = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERSION2 = os.path.join(FAST, "studies", "version2_hopper.cu")
VERSION3 = os.path.join(FAST, "csrc", "version3_persistent.cuh")
# The shared part of each file: from its first section to its kernel's.
FIRST, KERNEL = "// ---- The producer, the consumers and the epilogue", "// ---- The kernel"


def pipeline(text):
    return text[text.index(FIRST):text.index(KERNEL)]


def read(path):
    with open(path) as file:
        return file.read()


def test_version3_holds_version2s_pipeline_unchanged():
    assert pipeline(read(VERSION2)) == pipeline(read(VERSION3))


def test_a_pipeline_changed_in_one_file_is_seen():
    version2 = read(VERSION2)
    changed = version2.replace("mmaWait<0>();", "mmaWait<1>();", 1)
    assert changed != version2 and pipeline(changed) != pipeline(read(VERSION3))
