"""test_fast_hints.py: where the table grades day87_fast, its hints name this folder's
namespace and files, never the lesson's (no GPU needed).

    cd fast && python -m pytest tests/test_fast_hints.py

Each hint that test_op.Operator holds is formatted as the table formats it, for the fast
operator: no text may send its reader to the lesson's kernel.cu, binding.cpp or namespace,
and each fast/ path it names must exist. The lesson's own hints, held to the same rule,
must break it: the check can fail.
"""

import os
import re

from tests.lesson_folder import LESSON

import test_op  # noqa: E402
from tests.test_fast import FAST  # noqa: E402

HINTS = ["gate_hint", "gate_compile_hint", "exercise_hint", "no_impl_hint", "no_fake_hint",
         "fake_order_hint", "no_backward_hint", "none_gradient_hint"]
LESSON_ONLY = re.compile(r"(?<![\w/])(kernel\.cu|binding\.cpp)|\(day87,|day87::")


def formatted(operator, hint):
    return getattr(operator, hint).format(
        launcher=operator.launcher, launcher_file=operator.launcher_file, number=1,
        device="CPU", name=f"{operator.namespace}::wmma_mm_bias", file=operator.python_name)


def problems(operator):
    found = []
    for hint in HINTS:
        text = formatted(operator, hint)
        found += [f"{hint} names the lesson's {match.group(0)!r}: {text}"
                  for match in LESSON_ONLY.finditer(text)]
        found += [f"{hint} names {path}, which does not exist" for path in
                  re.findall(r"(?<![\w/])fast/[\w/.]+\.\w+", text)
                  if not os.path.exists(os.path.join(LESSON, path))]
    return found


def test_every_hint_is_an_attribute():
    for hint in HINTS:
        assert isinstance(getattr(test_op.Operator, hint), str), hint


def test_fast_hints_name_its_own_files():
    assert problems(FAST) == []


def test_the_lessons_hints_would_be_caught():
    assert problems(test_op.LESSON), "the check finds nothing in the lesson's own hints"


def test_missing_implementation_hint_as_the_table_gives_it():
    hint = test_op.forward_hint(FAST, NotImplementedError("no kernel for CPU"), "CPU")
    assert "STABLE_TORCH_LIBRARY_IMPL(day87_fast, CPU, m)" in hint, hint
    assert "fast/csrc/binding.cpp" in hint, hint
