"""Importing this puts the lesson's folder (two up from here) first on sys.path, for
the tools that use the lesson's table (test_op.py), its op.py or its checks/.

    from tests import lesson_folder  # noqa: F401  (before `import test_op`)

The one place in fast/ that edits sys.path. fast/'s own modules need no such edit:
its tools run as modules from fast/ (`python -m tests.test_fast`), which puts fast/
on the path.
"""

import os
import sys

LESSON = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CHECKS = os.path.join(LESSON, "checks")  # hardening.py, self_test.py, test_build.py
for folder in (CHECKS, LESSON):
    if folder not in sys.path:
        sys.path.insert(0, folder)
