"""layout_checks.py: fast/'s own rows where its contract departs from the lesson's, which
test_fast.py runs in place of the lesson's rows of the same names.

day87_fast's CPU reference takes b column-major (nn.Linear's weight.t()) as well as
row-major, and M of any size; its CUDA kernels take neither until a GPU run proves them,
and their refusals say what the CPU takes (fast/src/day87_fast/layouts.py).

- "1 contract, cpu": the lesson's calls that must raise, less its column-major b, which
  day87_fast takes; two layouts it still refuses; and the calls it takes, each equal to
  torch's float64 product: b column-major, M of 1, 127 and 129.
- "1 contract, cuda": the lesson's row; then the refusals of a column-major b and of a
  ragged M end with the binding's notes of what the CPU takes.
- "3 opcheck, cpu f64": the lesson's opcheck, then wmma_mm and wmma_mm_bias on a weight's
  transpose (a view, column-major) and at M = 129.
"""

import os
import re

import torch

from tests import lesson_folder  # noqa: F401  the lesson's test_op.py importable
import test_op  # noqa: E402  the lesson's harness: its calls, its helpers
from test_op import double, half, require  # noqa: E402

from day87_fast import layouts, lesson_copy  # noqa: E402  the installed package

BINDING = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc",
                       "binding.cpp")


def binding_text(name):
    """The string constant `name` of fast/csrc/binding.cpp: its literals, joined."""
    with open(BINDING) as source:
        found = re.search(rf"const char\* const {name} =\s*((?:\"[^\"]*\"\s*)+);",
                          source.read())
    assert found, f"{BINDING} defines no const char* const {name}"
    return "".join(re.findall(r"\"([^\"]*)\"", found.group(1)))


def takes_column_major(b):  # b in the layout day87_fast's CPU reference adds to the lesson's
    return torch.is_tensor(b) and b.dim() == 2 and layouts.column_major_only(b)


def contract_calls_cpu():
    """(a, b, the rule) for CPU calls that break one rule each: the lesson's, less those
    whose b is column-major, and the layouts day87_fast still refuses."""
    lessons = [call for call in test_op.contract_calls("cpu") if not takes_column_major(call[1])]
    return lessons + [(double(3, 4).t(), double(3, 5), "contiguous"),  # a column-major
                      (double(4, 3), double(3, 10)[:, ::2], "contiguous")]  # b's every 2nd column


def calls_taken_cpu():
    """(what, a, b): calls that the lesson refuses or never tries, and day87_fast takes."""
    return [("b column-major (a weight's transpose)", double(4, 3), double(5, 3).t()),
            *[(f"M = {rows}", double(rows, 16), double(16, 24)) for rows in (1, 127, 129)],
            ("M = 129, b column-major", double(129, 16), double(24, 16).t())]


def check_contract_cpu(operator):
    """Failure modes: a column-major b refused, or read row-major (a wrong answer)."""
    calls = contract_calls_cpu()
    for a, b, rule in calls:
        test_op.expect_raise(operator.wrapper, a, b, rule)
    taken = calls_taken_cpu()
    for what, a, b in taken:
        try:
            c = operator.wrapper(a, b)
        except RuntimeError as error:
            raise test_op.Fail(f"{what}: refused: {test_op.first_line(error)}") from None
        expected = torch.matmul(a, b)
        require(c.shape == expected.shape and torch.allclose(c, expected, rtol=1e-12, atol=0),
                f"{what}: {test_op.describe(c)} differs from torch.matmul's by up to "
                f"{(c - expected).abs().max().item() if c.shape == expected.shape else '-'}")
    return (f"{len(calls)} calls raised, each naming its rule; {len(taken)} taken and right: "
            "b column-major, M = 1, 127, 129")


def check_contract_cuda(operator):
    """The lesson's row, then: the refusals of a column-major b and of a ragged M say what
    the CPU takes (fast/csrc/binding.cpp's notes)."""
    said = test_op.check_contract(operator, "cuda")
    for a, b, rule, note in (
            (half(128, 16), half(128, 16).t(), "contiguous", binding_text("kColumnMajorOnCuda")),
            (half(100, 16), half(16, 128), "tile", lesson_copy.RAGGED_M_ON_CUDA)):
        message = test_op.expect_raise(operator.wrapper, a, b, rule)
        require(message.endswith(f"; {note}"), f"rule '{rule}': {message!r} does not end with "
                f"the note of what the CPU takes: {note!r}")
    return said + "; a column-major b and a ragged M refused, saying what the CPU takes"


def check_opcheck_cpu(operator):
    """The lesson's opcheck, then each operator on a weight's transpose and at M = 129."""
    said = test_op.check_opcheck(operator, "cpu")
    weight = double(5, 3, requires_grad=True)
    cases = [("wmma_mm, b = weight.t()", operator.overload,
              (double(7, 3, requires_grad=True), weight.t())),
             ("wmma_mm, M = 129", operator.overload,
              (double(129, 16, requires_grad=True), double(16, 24, requires_grad=True)))]
    if operator.bias_op is not None:  # the exercise's operator, where it is written
        cases.append(("wmma_mm_bias, b = weight.t()", operator.bias_op.default,
                      (double(7, 3, requires_grad=True), weight.t(),
                       double(5, requires_grad=True))))
    failed = {}
    for what, overload, arguments in cases:
        results = torch.library.opcheck(overload, arguments, raise_exception=False)
        failed.update({f"{what}: {test}": outcome for test, outcome in results.items()
                       if outcome != "SUCCESS"})
    require(not failed, f"opcheck failed: {failed}")
    return f"{said}; and on b = weight.t() and M = 129 ({len(cases)} calls)"


# (name, what it compares, check(operator)): each under the name of the lesson's row it
# replaces.
ROWS = [("1 contract, cpu", "refusals by rule; b column-major, ragged M taken",
         check_contract_cpu),
        ("1 contract, cuda", "refusals by rule, saying what the CPU takes", check_contract_cuda),
        ("3 opcheck, cpu f64", "schema, fake, autograd; b = weight.t(), M = 129",
         check_opcheck_cpu)]
