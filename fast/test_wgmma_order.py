"""test_wgmma_order.py: wgmma_order.py passes the Hopper kernel as it is, names each
MMA-order bug that planted_bugs.py plants, and passes the Hopper bugs that are not
about MMA order (no GPU needed: it reads the PTX).

    python -m pytest fast/test_wgmma_order.py
"""

import os
import sys

import pytest

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FAST)
import planted_bugs  # noqa: E402
from wgmma_order import order_problems  # noqa: E402

nvcc_missing = not os.path.exists(os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
pytestmark = pytest.mark.skipif(nvcc_missing, reason="needs nvcc (CUDA_HOME) to compile the kernels to PTX")

HOPPER_BUGS = [name for name, bug in planted_bugs.BUGS.items() if bug.hopper]


def test_every_mma_is_in_order():
    assert order_problems(planted_bugs.REPOSITORY) == []


@pytest.mark.parametrize("name", HOPPER_BUGS)
def test_each_hopper_bug(name, tmp_path):
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), name, planted_bugs.BUGS[name].edits)
    problems = order_problems(str(tmp_path / "copy"))
    if planted_bugs.WGMMA_ORDER in planted_bugs.BUGS[name].caught_by:
        # Named in both plans' kernels, by what the walk saw, not by a missing instruction.
        assert len({problem.split(":")[0] for problem in problems}) == 2, problems
        assert not any("at all" in problem for problem in problems), problems
    else:
        assert problems == [], problems
