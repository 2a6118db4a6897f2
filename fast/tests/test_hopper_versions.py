"""pytest: version 3 holds version 2's producer, consumers and epilogue unchanged, as its
opening comment says and as fast/README's `diff` of the two files relies on; version 4
holds version 3's consumer but for where a warp hands a stage back (no GPU).

    cd fast && python -m pytest -q tests/test_hopper_versions.py
"""
import os

SOURCES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")
# The shared part of each file: from its first section to its kernel's.
FIRST, KERNEL = "// ---- The producer, the consumers and the epilogue", "// ---- The kernel"


def pipeline(text):
    return text[text.index(FIRST):text.index(KERNEL)]


def read(name):
    with open(os.path.join(SOURCES, name)) as file:
        return file.read()


def test_version3_holds_version2s_pipeline_unchanged():
    assert pipeline(read("version2_hopper.cuh")) == pipeline(read("version3_persistent.cuh"))


# Version 4's consumer: version 3's, its warps arriving in every block of the cluster.
OWN_BLOCK = "        if (threadIdx.x % 32 == 0) arrive(&ring.empty[stage]);\n"
EVERY_BLOCK = ("        if (threadIdx.x % 32 == 0)\n"
               "            for (int rank = 0; rank < kClusterSize; ++rank) "
               "arriveInBlock(&ring.empty[stage], rank);\n")


def consumer(text):
    """consumeTile, from its signature to the end of its body."""
    start = text.index("__device__ __forceinline__ void consumeTile(")
    return text[start:text.index("\n}\n", start)]


def test_version4_holds_version3s_consumer_but_its_arrive():
    version3, version4 = read("version3_persistent.cuh"), read("version4_cluster.cuh")
    assert OWN_BLOCK in consumer(version3) and EVERY_BLOCK in consumer(version4)
    assert consumer(version4).replace(EVERY_BLOCK, OWN_BLOCK) == consumer(version3)


def test_a_pipeline_changed_in_one_file_is_seen():
    version2 = read("version2_hopper.cuh")
    changed = version2.replace("mmaWait<0>();", "mmaWait<1>();", 1)
    assert changed != version2 and pipeline(changed) != pipeline(read("version3_persistent.cuh"))


def test_a_consumer_changed_in_version4_is_seen():
    version4 = read("version4_cluster.cuh")
    changed = version4.replace("mmaWait<0>();", "mmaWait<1>();", 1)
    assert consumer(changed).replace(EVERY_BLOCK, OWN_BLOCK) != consumer(
        read("version3_persistent.cuh"))
