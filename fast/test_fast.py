"""test_fast.py: the lesson's table (test_op.py), run against day87_fast::wmma_mm.

    python fast/test_fast.py

Every row of the lesson's table, the exercise's included: check 6 grades this
folder's own wmma_mm_bias. After row 14 come its own row, "13 backward accuracy,
scaled", and checks/hardening.py's rows 15 and 16. Rows 13 and 16 bound the
gradients with this folder's allowance for grad rounded to FP16
(scaled_backward_checks.py). The same provenance and closing line as
`python test_op.py`; the exit status is 1 if anything failed.

FAST, the fast operator as the table sees it, is importable: fast/self_test_fast.py
hands its checks deliberately wrong backwards. Importing this file builds the
operator (fast_op.py).
"""

import os
import sys

FAST_FOLDER = os.path.dirname(os.path.abspath(__file__))
LESSON_FOLDER = os.path.dirname(FAST_FOLDER)
sys.path[:0] = [FAST_FOLDER, LESSON_FOLDER, os.path.join(LESSON_FOLDER, "checks")]  # fast_op.py; test_op.py; hardening.py

import fast_op  # noqa: E402
import hardening  # noqa: E402
import test_op  # noqa: E402
from scaled_backward_checks import SCALED_BACKWARD_ROW, rounded_left_allowance  # noqa: E402

# The profiler row names the kernel that the path runs at its shape: a Hopper kernel
# where DAY87_FAST_KERNEL forces one, else version 1, which the automatic choice takes
# for a grid as small as that row's (fast/kernel.cu's chooseLaunch).
KERNEL = {"persistent": "tuned::hopperPersistentKernel", "hopper": "tuned::hopperGemmKernel"}.get(
    os.environ.get("DAY87_FAST_KERNEL"), "tuned::wmmaGemmKernel")
FAST = test_op.Operator(wrapper=fast_op.wmma_mm, name="day87_fast::wmma_mm",
                        kernel=KERNEL, build=fast_op.BUILD,
                        python_file=fast_op.__file__, bias_wrapper=fast_op.wmma_mm_bias,
                        gradient_bound=rounded_left_allowance, more_rows=(SCALED_BACKWARD_ROW, *hardening.ROWS))

if __name__ == "__main__":
    test_op.main(FAST)
