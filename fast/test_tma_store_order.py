"""test_tma_store_order.py: tma_store_order.py's model on hand-written sequences; then
it passes version 4's kernels as they are, names each store-order bug that
planted_bugs.py plants, and passes version 4's other bugs (no GPU needed: it reads
the PTX).

    python -m pytest fast/test_tma_store_order.py
"""

import os
import sys

import pytest

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FAST)
import planted_bugs  # noqa: E402
from tma_store_order import store_problems, store_problems_in  # noqa: E402

nvcc_missing = not os.path.exists(
    os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
needs_nvcc = pytest.mark.skipif(nvcc_missing,
                                reason="needs nvcc (CUDA_HOME) to compile the kernels to PTX")

CLUSTER_BUGS = [name for name, bug in planted_bugs.BUGS.items() if bug.cluster]

# One sub-tile's store, as storeTile's unrolled loop holds it, with two buffers.
READ_WAIT, BARRIER, WRITE, FENCE = ("@%p1 cp.async.bulk.wait_group.read 1;",
                                    "bar.sync %r10, 128;", "st.shared.v2.f32 [%r1], {%f1, %f2};",
                                    "fence.proxy.async.shared::cta;")
STORE = ("@%p1 cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%rd2, {%r3, %r4}], [%r1];",
         "@%p1 cp.async.bulk.commit_group;")
SUB_TILE = (READ_WAIT, BARRIER, WRITE, WRITE, FENCE, BARRIER, *STORE)
END = ("@%p1 cp.async.bulk.wait_group 0;", "ret;")


def read(*body):
    return store_problems_in("kernel", [*body, *END], buffers=2)


@pytest.mark.parametrize("body, problem", [
    (SUB_TILE * 3, None),
    ((WRITE, FENCE, BARRIER, *STORE), "written with no cp.async.bulk.wait_group.read"),
    (SUB_TILE + (BARRIER, WRITE, FENCE, BARRIER, *STORE), "written with no"),
    (SUB_TILE + (READ_WAIT, WRITE, FENCE, BARRIER, *STORE), "written with no"),
    ((READ_WAIT.replace("read 1", "read 2"),) + SUB_TILE[1:], "with 2 staging buffers"),
    ((READ_WAIT, BARRIER, WRITE, BARRIER, *STORE), "not fenced"),
    ((READ_WAIT, BARRIER, WRITE, FENCE, *STORE), "not fenced"),
    ((READ_WAIT, BARRIER, WRITE, BARRIER, FENCE, *STORE), "not fenced"),
])
def test_the_model(body, problem):
    problems = read(*body)
    if problem is None:
        assert problems == []
    else:
        assert problems and all(problem in text for text in problems), problems


@pytest.mark.parametrize("end", ["ret;", "@%p2 exit;"])
def test_the_end_waits_for_the_stores(end):
    problems = store_problems_in("kernel", [*SUB_TILE, end], buffers=2)
    assert problems and "ends with TMA stores not waited for" in problems[0]


@needs_nvcc
def test_every_store_is_in_order():
    assert store_problems(planted_bugs.REPOSITORY) == []


@needs_nvcc
@pytest.mark.parametrize("name", CLUSTER_BUGS)
def test_each_cluster_bug(name, tmp_path):
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), name, planted_bugs.BUGS[name])
    problems = store_problems(str(tmp_path / "copy"))
    if planted_bugs.TMA_STORE_ORDER in planted_bugs.BUGS[name].caught_by:
        # Named in both of version 4's kernels (each plan), by what the reading saw.
        assert len({problem.split(":")[0] for problem in problems}) == 2, problems
        assert not any("at all" in problem for problem in problems), problems
    else:
        assert problems == [], problems
