"""test_wgmma_order.py: wgmma_order.py's model on hand-written sequences; then it passes
the Hopper kernels as they are (version 3's, and version 2's in its study), names each
MMA-order bug that planted_bugs.py plants, and passes the Hopper bugs that are not about
MMA order (no GPU needed: it reads the PTX).

    cd fast && python -m pytest tests/test_wgmma_order.py
"""

import pytest

from proof import REPOSITORY, planted_bugs
from proof.ptx.wgmma_order import order_problems, order_problems_in
from tests.walker_helpers import (assert_caught_where_it_must_be, assert_problems_say,
                                  bugs_where, needs_nvcc, planted_copy)

HOPPER_BUGS = bugs_where(lambda bug: bug.hopper)

# The walk's model on hand-written sequences: a loop of one stage per pass, its body
# between the label and the branch.
FENCE, MMA, COMMIT, ARRIVE = "wgmma.fence.sync.aligned;", \
    "wgmma.mma_async.sync.aligned.m64n128k16 {};", \
    "wgmma.commit_group.sync.aligned;", "mbarrier.arrive.shared.b64 _, [%r1];"


def walk(*body):
    # A fence after the loop, off every MMA's path, so that no case is judged by the
    # check's "no wgmma.fence at all" early exit.
    lines = ["$L_loop:", *body, "@%p1 bra $L_loop;", FENCE, "wgmma.wait_group.sync.aligned 0;",
             "ret;"]
    return order_problems_in("kernel", lines)


@pytest.mark.parametrize("body, problem", [
    ((FENCE, MMA, MMA, COMMIT, "wgmma.wait_group.sync.aligned 0;", ARRIVE), None),
    # a group kept in flight: the fence after wait_group 1 opens the next one
    ((FENCE, MMA, COMMIT, "wgmma.wait_group.sync.aligned 1;", FENCE, MMA, COMMIT,
      "wgmma.wait_group.sync.aligned 0;"), None),
    ((MMA, COMMIT, "wgmma.wait_group.sync.aligned 0;"), "opens a group with no wgmma.fence"),
    ((FENCE, MMA, COMMIT, "wgmma.wait_group.sync.aligned 1;", MMA, COMMIT,
      "wgmma.wait_group.sync.aligned 0;"), "opens a group with no wgmma.fence"),
    ((FENCE, MMA, "wgmma.wait_group.sync.aligned 0;", COMMIT), "not committed"),
    ((FENCE, MMA, COMMIT, "wgmma.wait_group.sync.aligned 1;", ARRIVE,
      "wgmma.wait_group.sync.aligned 0;"), "while MMAs may still run"),
])
def test_the_model(body, problem):
    assert_problems_say(walk(*body), problem)


@needs_nvcc
def test_every_mma_is_in_order():
    assert order_problems(REPOSITORY) == []


@needs_nvcc
@pytest.mark.parametrize("name", HOPPER_BUGS)
def test_each_hopper_bug(name, tmp_path):
    bug = planted_bugs.BUGS[name]
    # Those it must catch named in the four kernels of versions 3 and 2 (the bug is
    # planted in version 3's file and the study's, each kernel in both plans).
    assert_caught_where_it_must_be(order_problems(planted_copy(tmp_path, name, bug)), bug,
                                   planted_bugs.WGMMA_ORDER, kernels=4)
