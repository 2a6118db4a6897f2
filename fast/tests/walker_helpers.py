"""What the PTX walkers' tests share (test_warp_barriers.py, test_wgmma_order.py): the mark
that skips where there is no nvcc to compile the kernels to PTX (test_switches.py uses it
too), the planted bugs of one part, a walker run on a copy with one bug planted, and what
a walker's problems must say.
"""

import os
import shutil

import pytest

from proof import planted_bugs
from proof.ptx import nvcc

needs_nvcc = pytest.mark.skipif(shutil.which(nvcc()) is None,
                                reason="needs nvcc (CUDA_HOME) to compile the kernels to PTX")


def bugs_where(planted_in):
    """The names of the planted bugs for which planted_in(bug) holds, e.g. those of the
    Hopper part: lambda bug: bug.hopper."""
    return [name for name, bug in planted_bugs.BUGS.items() if planted_in(bug)]


def planted_copy(tmp_path, name, bug):
    """A copy of the repository in tmp_path with `bug` (planted_bugs.Bug) planted: its
    folder, for a walker to read."""
    copy = os.path.join(tmp_path, "copy")
    planted_bugs.copy_with_bug(copy, name, bug)
    return copy


def assert_problems_say(problems, expected):
    """No problem where `expected` is None; else at least one, each saying `expected`."""
    if expected is None:
        assert problems == []
    else:
        assert problems and all(expected in text for text in problems), problems


def assert_caught_where_it_must_be(problems, bug, walker, kernels):
    """Where `walker` must catch `bug`: its problems name `kernels` kernels (each
    problem's text before its first ':' is its architecture and kernel), by what the
    walk saw, not by a missing instruction. Where not: no problem at all."""
    if walker in bug.caught_by:
        assert len({problem.split(":")[0] for problem in problems}) == kernels, problems
        assert not any("at all" in problem for problem in problems), problems
    else:
        assert problems == [], problems
