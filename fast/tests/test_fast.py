"""test_fast.py: the lesson's table (test_op.py), run against day87_fast::wmma_mm.

    cd fast && python -m tests.test_fast

The lesson's rows 1 to 14, the exercise's included: check 6 grades this folder's own
wmma_mm_bias. Rows 1 and "3 opcheck, cpu f64" are fast/'s where its contract departs from
the lesson's (tests/layout_checks.py: b column-major and any M on the CPU; the CUDA
refusals saying so). Row 13 is fast/'s (tests/scaled_backward_checks.py): the lesson's
gradients, bounded with the allowance for grad rounded to FP16. After row 14 come
its own row, "13 backward accuracy, scaled", and checks/hardening.py's rows 15 and
16 (row 16 with the same allowance). The same provenance and closing line as
`python test_op.py`; the exit status is 1 if anything failed.

FAST, the fast operator as the table sees it, is importable: proof/self_test_fast.py
hands its checks deliberately wrong backwards. The table grades the installed package
(`pip install --no-build-isolation ./fast`): fast/src is not on the path, so no library
from the source tree is loaded. Importing this file builds the lesson's operator, which
the table compares against, and row 14's gate where it runs.
"""

import faulthandler
import os
import sys

import torch

from tests import lesson_folder  # noqa: F401  the lesson's test_op.py and checks/ importable

import day87_fast  # noqa: E402  the installed package
import hardening  # noqa: E402
import op  # noqa: E402  the lesson's: its toolkit, for row 14's gate
import test_op  # noqa: E402
from tests import layout_checks  # noqa: E402
from tests.scaled_backward_checks import (BACKWARD_ACCURACY_ROW,  # noqa: E402
                                          SCALED_BACKWARD_ROW, gradient_allowance)


class FastOperator(test_op.Operator):
    """day87_fast as the table sees it. The profiler row names the kernel that the path
    runs at its shape (256 x 512, K = 128): the one DAY87_FAST_KERNEL forces, else
    version 1, which the automatic choice takes for a grid as small as that
    (fast/csrc/launch_policy.cu's chooseLaunch). Its gradients get gradient_allowance beyond
    the lesson's bound (checks/hardening.py's row 16 asks for it)."""
    kernel = {"persistent": "tuned::version3::hopperPersistentKernel"}.get(
        os.environ.get("DAY87_FAST_KERNEL"), "tuned::version1::wmmaGemmKernel")
    gradient_allowance = staticmethod(gradient_allowance)
    python_name = "day87_fast/__init__.py"  # where its fake and backward are registered
    gate = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "proof", "gate.cu")  # row 14's: fast/'s own, with both versions
    launcher, launcher_file = "launchFastGemm", "fast/csrc/launch_policy.cu"
    # Check 6's hints, where this folder's fix goes: its stable binding, and the lesson's
    # README for the exercise's hints.
    no_impl_hint = ("No {device} implementation: fast/csrc/binding.cpp's "
                    "STABLE_TORCH_LIBRARY_IMPL(day87_fast, {device}, m) needs an m.impl spelt "
                    "as in the schema, its function wrapped in TORCH_BOX.")
    exercise_hint = "Hint {number} in the lesson's README.md exercise applies."
    fake_order_hint = ("{file}'s fake checks fast/csrc/binding.cpp's rules in its order: a and "
                       "b's (lesson_copy.check_matrices) before anything that needs a's dtype "
                       "(accumulate_dtype has none for float32)")

    def __init__(self, module):
        super().__init__(module.NAMESPACE, module, build=installed_build_facts(module))

    def gate_target(self, architecture):
        # The Hopper kernel (version 3) is compiled only for sm_90a, as in the operator's
        # build: a plain sm_90 gate would skip it, and refuse it forced.
        if architecture == "sm_90":
            return ["-gencode", "arch=compute_90a,code=sm_90a"]
        return super().gate_target(architecture)


def installed_build_facts(module):
    """The build facts the table reads, for an installed package: what its library was
    built for (module.BUILD), and the lesson's toolkit, which builds row 14's gate. The
    "directory" is a name in the lesson's build cache, beside which row 14 caches the
    gate: never site-packages."""
    toolkit = op.find_toolkit()
    cache = (os.environ.get("TORCH_EXTENSIONS_DIR")
             or os.path.expanduser("~/.cache/torch_extensions"))
    return {"with_cuda": module.BUILD["with_cuda"], "archs": module.BUILD["archs"],
            "toolkit": toolkit, "cuda_home": toolkit and toolkit["home"],
            "directory": os.path.join(cache, "day87_fast-installed"),
            "library": module.BUILD["library"]}


FAST = FastOperator(day87_fast)


def with_operator(rows, operator):
    """(name, what it compares, check(operator)) rows as run_table takes them."""
    return [(name, compares, lambda check=check: check(operator))
            for name, compares, check in rows]


def fast_rows(operator=FAST):
    """The lesson's rows 1 to 14 with rows 1, 3 (CPU) and 13 this folder's, then the rows
    of its own."""
    rows = test_op.lesson_rows(operator)
    # Rows 1 and 3 (CPU) where the contract departs from the lesson's; row 13: the lesson's
    # bounds the error of its FP32 backward, and this one rounds grad to FP16 first.
    # index() raises where the lesson's table has no such row.
    for own_row in with_operator([*layout_checks.ROWS, BACKWARD_ACCURACY_ROW], operator):
        replaced = [name for name, _, _ in rows].index(own_row[0])
        rows[replaced] = own_row
    return rows + with_operator([SCALED_BACKWARD_ROW, *hardening.ROWS], operator)


def main():
    # As test_op.py's main: a crash in native code prints the Python stack that led to it.
    faulthandler.enable()
    test_op.print_provenance(FAST)
    print(f"day87_fast: {day87_fast.__file__}, built with torch "
          f"{day87_fast.BUILD['built_with_torch']}, running under torch {torch.__version__}\n")
    reason = test_op.why_no_kernel(FAST)
    notes = [f"the CUDA kernel was not run: {reason}"] if reason else []
    sys.exit(0 if test_op.run_table(fast_rows(FAST), notes) else 1)


if __name__ == "__main__":
    main()
