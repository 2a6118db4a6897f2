"""test_fast.py: the lesson's table (test_op.py), run against day87_fast::wmma_mm.

    python fast/test_fast.py

Every row of the lesson's table, the exercise's included: check 6 grades this
folder's own wmma_mm_bias. The same provenance, rows and closing line as
`python test_op.py`; the exit status is 1 if anything failed.
"""

import os
import sys

if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lesson
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

    import fast_op
    import test_op

    FAST = test_op.Operator(wrapper=fast_op.wmma_mm, name="day87_fast::wmma_mm",
                            kernel="tuned::wmmaGemmKernel", build=fast_op.BUILD,
                            python_file=fast_op.__file__)
    test_op.main(FAST)
