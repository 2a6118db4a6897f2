"""test_warp_barriers.py: warp_barriers.py passes both kernels as they are, names each
barrier that planted_bugs.py removes, and follows loops and branches (no GPU needed:
it reads the PTX).

    python -m pytest fast/test_warp_barriers.py
"""

import os
import sys

import pytest

FAST = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, FAST)
import planted_bugs  # noqa: E402
from warp_barriers import (  # noqa: E402
    BRANCH, EPILOGUE_STORE, LABEL, compiled_ptx, kernel_bodies, missing_barriers)

nvcc_missing = not os.path.exists(
    os.path.join(os.environ.get("CUDA_HOME", "/usr/local/cuda"), "bin", "nvcc"))
pytestmark = pytest.mark.skipif(nvcc_missing,
                                reason="needs nvcc (CUDA_HOME) to compile the kernels to PTX")

BARRIER_BUGS = [name for name, bug in planted_bugs.BUGS.items()
                if planted_bugs.WARP_BARRIERS in bug.caught_by]


def test_every_epilogue_has_its_barriers():
    assert missing_barriers(planted_bugs.REPOSITORY) == []


@pytest.mark.parametrize("name", BARRIER_BUGS)
def test_a_missing_fast_barrier_is_named(name, tmp_path):
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), name, planted_bugs.BUGS[name])
    problems = missing_barriers(str(tmp_path / "copy"))
    assert problems and all("version1" in problem for problem in problems), problems
    assert all("with no barrier between" in problem for problem in problems), problems


def branches_back_in_epilogue(lines):
    """Whether a branch after the kernel's first store to shared memory goes back to a
    label before it: a loop the walk must follow."""
    first_store = next(i for i, line in enumerate(lines) if EPILOGUE_STORE.match(line))
    labels = {match.group(1): i for i, line in enumerate(lines)
              for match in [LABEL.match(line)] if match}
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
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), "a path",
                               planted_bugs.Bug(planted_bugs.VERSION1, edits, ()))
    # the case is only a loop if nvcc kept one: a branch back, in some epilogue
    if KEPT_LOOP in edits:
        bodies, _ = kernel_bodies(compiled_ptx(str(tmp_path / "copy"), "90"))
        assert any(branches_back_in_epilogue(lines) for lines in bodies.values())
    problems = missing_barriers(str(tmp_path / "copy"))
    assert bool(problems) == named, problems
    assert all("with no barrier between" in problem for problem in problems), problems


def test_a_missing_lesson_barrier_is_named(tmp_path):
    """The lesson's kernel.cu stages its output the same way, and is walked too."""
    barrier = "        __syncwarp();  // the strip is read out before the next one overwrites it\n"
    planted_bugs.copy_with_bug(str(tmp_path / "copy"), "the lesson's second barrier removed",
                               planted_bugs.Bug(("kernel.cu",), [(barrier, "")], ()))
    problems = missing_barriers(str(tmp_path / "copy"))
    assert problems and all("_Z14wmmaGemmKernel12GemmOperands" in problem
                            for problem in problems), problems
