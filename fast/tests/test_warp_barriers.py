"""test_warp_barriers.py: warp_barriers.py passes both kernels as they are, names each
barrier that planted_bugs.py removes, and follows loops and branches (no GPU needed:
it reads the PTX).

    cd fast && python -m pytest tests/test_warp_barriers.py
"""

import pytest

from proof import REPOSITORY, planted_bugs
from proof.ptx import BRANCH, compiled_ptx, kernel_bodies, labels_in
from proof.ptx.warp_barriers import ENTRY, EPILOGUE_STORE, SOURCES, missing_barriers
from tests.walker_helpers import bugs_where, needs_nvcc, planted_copy

pytestmark = needs_nvcc

BARRIER_BUGS = bugs_where(lambda bug: planted_bugs.WARP_BARRIERS in bug.caught_by)


def test_every_epilogue_has_its_barriers():
    assert missing_barriers(REPOSITORY) == []


@pytest.mark.parametrize("name", BARRIER_BUGS)
def test_a_missing_fast_barrier_is_named(name, tmp_path):
    problems = missing_barriers(planted_copy(tmp_path, name, planted_bugs.BUGS[name]))
    assert problems and all("version1" in problem for problem in problems), problems
    assert all("with no barrier between" in problem for problem in problems), problems


def branches_back_in_epilogue(lines):
    """Whether a branch after the kernel's first store to shared memory goes back to a
    label before it: a loop the walk must follow."""
    first_store = next(i for i, line in enumerate(lines) if EPILOGUE_STORE.match(line))
    labels = labels_in(lines)
    return any(labels[branch.group(2)] < i
               for i, line in enumerate(lines[first_store:], first_store)
               for branch in [BRANCH.match(line)] if branch)


# The epilogue's strip loop kept as a loop (its back edge), and a barrier on one side
# of a branch only: a walk of straight-line text would pass both wrongly.
STRIP_LOOP = ("#pragma unroll\n    for (int i = 0; i < Plan::kFragmentsM; ++i) {\n#pragma unroll\n"
              "        for (int j = 0; j < Plan::kFragmentsN; ++j)\n"
              "            wmma::store_matrix_sync")
KEPT_LOOP = (STRIP_LOOP, STRIP_LOOP.replace("#pragma unroll\n    for (int i",
                                            "#pragma unroll 1\n    for (int i", 1))
FIRST_BARRIER = ("                                    wmma::mem_row_major);\n"
                 "        __syncwarp();\n")
ONE_SIDED = (FIRST_BARRIER, FIRST_BARRIER.replace("__syncwarp();",
                                                  "if (partials != nullptr) __syncwarp();"))
SECOND_BARRIER_REMOVED = planted_bugs.BUGS["the strip is overwritten before it is read out"].edits


@pytest.mark.parametrize("edits, named", [
    ([KEPT_LOOP], False),
    ([KEPT_LOOP] + SECOND_BARRIER_REMOVED, True),
    ([ONE_SIDED], True),
], ids=["loop, barriers kept", "loop, second barrier removed", "first barrier on one branch only"])
def test_every_path_is_followed(edits, named, tmp_path):
    copy = planted_copy(tmp_path, "a path", planted_bugs.Bug(planted_bugs.VERSION1, edits, ()))
    # the case is only a loop if nvcc kept one: a branch back, in some epilogue
    if KEPT_LOOP in edits:
        bodies = kernel_bodies(compiled_ptx(copy, "90", SOURCES), ENTRY)
        assert any(branches_back_in_epilogue(lines) for lines in bodies.values())
    problems = missing_barriers(copy)
    assert bool(problems) == named, problems
    assert all("with no barrier between" in problem for problem in problems), problems


def test_a_missing_lesson_barrier_is_named(tmp_path):
    """The lesson's kernel.cu stages its output the same way, and is walked too."""
    barrier = "        __syncwarp();  // the strip is read out before the next one overwrites it\n"
    copy = planted_copy(tmp_path, "the lesson's second barrier removed",
                        planted_bugs.Bug(("kernel.cu",), [(barrier, "")], ()))
    problems = missing_barriers(copy)
    assert problems and all("_Z14wmmaGemmKernel12GemmOperands" in problem
                            for problem in problems), problems
