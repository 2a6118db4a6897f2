"""test_wgmma_order.py: wgmma_order.py's model on hand-written sequences; then it passes
the Hopper kernels as they are, names each MMA-order bug that planted_bugs.py plants, and
passes the Hopper bugs that are not about MMA order (no GPU needed: it reads the PTX).

    python -m pytest fast/test_wgmma_order.py
"""

import os
import sys

import pytest

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FAST)
import planted_bugs  # noqa: E402
from wgmma_order import order_problems, order_problems_in  # noqa: E402

nvcc_missing = not os.path.exists(
    os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
needs_nvcc = pytest.mark.skipif(nvcc_missing,
                                reason="needs nvcc (CUDA_HOME) to compile the kernels to PTX")

HOPPER_BUGS = [name for name, bug in planted_bugs.BUGS.items() if bug.hopper]

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
    problems = walk(*body)
    if problem is None:
        assert problems == []
    else:
        assert problems and all(problem in text for text in problems), problems


@needs_nvcc
def test_every_mma_is_in_order():
    assert order_problems(planted_bugs.REPOSITORY) == []


@needs_nvcc
@pytest.mark.parametrize("name", HOPPER_BUGS)
def test_each_hopper_bug(name, tmp_path):
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), name, planted_bugs.BUGS[name])
    problems = order_problems(str(tmp_path / "copy"))
    if planted_bugs.WGMMA_ORDER in planted_bugs.BUGS[name].caught_by:
        # Named in the four kernels of versions 2 and 3 (the bug is planted in both
        # versions' files, each kernel in both plans), by what the walk saw, not by a
        # missing instruction.
        assert len({problem.split(":")[0] for problem in problems}) == 4, problems
        assert not any("at all" in problem for problem in problems), problems
    else:
        assert problems == [], problems
