"""test_layouts.py: fast/'s own rows (tests/layout_checks.py) pass on day87_fast, and each
fails on an operator without what it checks.

    cd fast && python -m pytest tests/test_layouts.py

- "1 contract, cpu" and "3 opcheck, cpu f64" pass on day87_fast; both fail on the lesson's
  operator, which refuses a column-major b.
- "1 contract, cpu" fails on an operator that reads a column-major b as if it were
  row-major.
- A column-major b gets its gradient column-major, and a row-major b row-major; seen
  failing on the lesson's formula (every gradient of b row-major).
"""

import pytest
import torch

from tests import layout_checks
from tests.test_fast import FAST
import test_op  # the lesson's table, made importable by tests.test_fast

import day87_fast  # the installed package
from day87_fast import layouts


def reads_b_row_major(a, b):
    """Planted: a column-major b's memory read as a row-major K x N matrix; every other
    call as day87_fast's."""
    if layout_checks.takes_column_major(b):
        b = torch.as_strided(b, b.shape, (b.shape[1], 1))
    return day87_fast.wmma_mm(a, b)


@pytest.mark.parametrize("check", [layout_checks.check_contract_cpu,
                                   layout_checks.check_opcheck_cpu],
                         ids=["1 contract, cpu", "3 opcheck, cpu f64"])
def test_rows_pass_on_day87_fast(check):
    check(FAST)


@pytest.mark.parametrize("check, said", [
    (layout_checks.check_contract_cpu, r"b column-major \(a weight's transpose\): refused"),
    (layout_checks.check_opcheck_cpu, r"opcheck failed: \{'wmma_mm, b = weight\.t\(\)")],
    ids=["1 contract, cpu", "3 opcheck, cpu f64"])
def test_rows_fail_on_the_lessons_operator(check, said):
    with pytest.raises(test_op.Fail, match=said):
        check(test_op.LESSON)


def test_contract_row_fails_on_a_column_major_b_read_row_major():
    with pytest.raises(test_op.Fail, match="differs from torch.matmul's"):
        layout_checks.check_contract_cpu(FAST.with_wrapper(reads_b_row_major))


def gradient_layout_problems():
    """Where wmma_mm's gradients of a column-major and of a row-major b are not in b's
    layout (and a's in a's), or not a^T @ grad (grad @ b^T)."""
    problems = []
    a = torch.randn(7, 3, dtype=torch.float64, requires_grad=True)
    for b in (torch.randn(5, 3, dtype=torch.float64).t(), torch.randn(3, 5, dtype=torch.float64)):
        b.requires_grad_()
        grad = torch.randn(7, 5, dtype=torch.float64)
        grad_a, grad_b = torch.autograd.grad(day87_fast.wmma_mm(a, b), [a, b], grad)
        for name, gradient, tensor, expected in (("a", grad_a, a, grad @ b.detach().t()),
                                                 ("b", grad_b, b, a.detach().t() @ grad)):
            if gradient.stride() != tensor.stride():
                problems.append(f"{name} with strides {tensor.stride()}: its gradient's are "
                                f"{gradient.stride()}")
            if not torch.allclose(gradient, expected, rtol=1e-12, atol=1e-12):
                problems.append(f"{name} with strides {tensor.stride()}: a wrong gradient")
    return problems


def test_gradients_in_their_inputs_layouts():
    assert gradient_layout_problems() == []


def test_gradient_layout_check_catches_the_lessons_formula(monkeypatch):
    # Every b taken as row-major: the lesson's formula, grad_b = a^T @ grad, row-major.
    monkeypatch.setattr(layouts, "column_major_only", lambda matrix: False)
    assert gradient_layout_problems() == ["b with strides (1, 3): its gradient's are (5, 1)"]
