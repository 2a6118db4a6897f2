"""pytest: version 3 holds version 2's producer, consumers and epilogue unchanged, as its
opening comment says and as fast/README's `diff` of the two files relies on (no GPU).

    python -m pytest -q fast/test_hopper_versions.py
"""
import os

FAST = os.path.dirname(os.path.abspath(__file__))
# The shared part of each file: from its first section to its kernel's.
FIRST, KERNEL = "// ---- The producer, the consumers and the epilogue", "// ---- The kernel"


def pipeline(text):
    return text[text.index(FIRST):text.index(KERNEL)]


def read(name):
    with open(os.path.join(FAST, name)) as file:
        return file.read()


def test_version3_holds_version2s_pipeline_unchanged():
    assert pipeline(read("version2_hopper.cuh")) == pipeline(read("version3_persistent.cuh"))


def test_a_pipeline_changed_in_one_file_is_seen():
    version2 = read("version2_hopper.cuh")
    changed = version2.replace("mmaWait<0>();", "mmaWait<1>();", 1)
    assert changed != version2 and pipeline(changed) != pipeline(read("version3_persistent.cuh"))
