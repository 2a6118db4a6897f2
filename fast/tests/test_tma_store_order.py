"""test_tma_store_order.py: tma_store_order.py's model on hand-written sequences; then
it passes version 4's kernels as they are, names each store-order bug that
planted_bugs.py plants, and passes version 4's other bugs (no GPU needed: it reads
the PTX).

    cd fast && python -m pytest tests/test_tma_store_order.py
"""

import pytest

from proof import REPOSITORY, planted_bugs
from proof.ptx.tma_store_order import store_problems, store_problems_in
from tests.walker_helpers import (assert_caught_where_it_must_be, assert_problems_say,
                                  bugs_where, needs_nvcc, planted_copy)

CLUSTER_BUGS = bugs_where(lambda bug: bug.cluster)

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
    assert_problems_say(read(*body), problem)


@pytest.mark.parametrize("end", ["ret;", "@%p2 exit;"])
def test_the_end_waits_for_the_stores(end):
    problems = store_problems_in("kernel", [*SUB_TILE, end], buffers=2)
    assert problems and "ends with TMA stores not waited for" in problems[0]


@needs_nvcc
def test_every_store_is_in_order():
    assert store_problems(REPOSITORY) == []


@needs_nvcc
@pytest.mark.parametrize("name", CLUSTER_BUGS)
def test_each_cluster_bug(name, tmp_path):
    bug = planted_bugs.BUGS[name]
    # Those it must catch named in both of version 4's kernels (each plan).
    assert_caught_where_it_must_be(store_problems(planted_copy(tmp_path, name, bug)), bug,
                                   planted_bugs.TMA_STORE_ORDER, kernels=2)
