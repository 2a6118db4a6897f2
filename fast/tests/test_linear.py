"""test_linear.py: day87_fast.Linear drops in for torch.nn.Linear, checked on the CPU.

    cd fast && python -m pytest tests/test_linear.py

- An nn.Linear's state_dict loads into it, and its state_dict back into an nn.Linear.
- Its parameters' dtypes are nn.Linear's; on the CPU it computes in float64.
- In float64 on the CPU, its output and its gradients (input, weight, bias) equal
  nn.Linear's, for a batch of any shape and size. Seen failing: a layer whose operator
  reads weight.t() as if it were row-major.
- No copy of the weight, forward or backward: the operator receives the weight's own
  memory, and no copy of the weight's shape runs. Seen failing: a layer that transposes
  with a copy, and a backward that returns b's gradient row-major (AccumulateGrad then
  copies it into the weight's layout).
- torch.compile(fullgraph=True, dynamic=True): one graph for batches of 7, 129 and 3 rows,
  equal to nn.Linear, with no copy of the weight either.
"""

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import day87_fast  # the installed package
from day87_fast import layouts

# The profiler's names of the ops that copy a tensor.
COPYING_OPS = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_to_copy"}


def twins(in_features, out_features, bias=True, dtype=torch.float64, layer_class=None):
    """An nn.Linear and a day87_fast.Linear (or `layer_class`) with the same parameters."""
    torch.manual_seed(0)
    reference = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    layer = (layer_class or day87_fast.Linear)(in_features, out_features, bias=bias,
                                               dtype=dtype)
    layer.load_state_dict(reference.state_dict())
    return reference, layer


class ReadsWeightRowMajor(day87_fast.Linear):
    """Planted: an operator that reads the column-major weight.t() as if it were row-major
    (the weight's memory taken as an in x out matrix). For 2-D input."""

    def forward(self, input):
        as_row_major = torch.as_strided(self.weight, (self.in_features, self.out_features),
                                        (self.out_features, 1))
        if self.bias is None:
            return torch.ops.day87_fast.wmma_mm(input, as_row_major)
        return torch.ops.day87_fast.wmma_mm_bias(input, as_row_major, self.bias)


def differences_from_nn_linear(batch, bias, layer_class=None):
    """Which of the output and the gradients of input, weight and bias differ from
    nn.Linear's, in float64 on the CPU."""
    reference, layer = twins(24, 40, bias=bias, layer_class=layer_class)
    x = torch.randn(*batch, 24, dtype=torch.float64, requires_grad=True)
    expected, got = reference(x), layer(x)
    assert got.dtype == torch.float64 and got.shape == expected.shape, (got.dtype, got.shape)
    grad = torch.randn_like(expected)
    theirs = [expected, *torch.autograd.grad(expected, [x, *reference.parameters()], grad)]
    ours = [got, *torch.autograd.grad(got, [x, *layer.parameters()], grad)]
    names = ["output", "input's gradient", "weight's gradient", "bias's gradient"]
    return [name for name, mine, other in zip(names, ours, theirs)
            if not torch.allclose(mine, other, rtol=1e-12, atol=1e-12)]


def test_state_dict_loads_both_ways():
    reference = torch.nn.Linear(24, 40)
    layer = day87_fast.Linear(24, 40)
    assert layer.state_dict().keys() == reference.state_dict().keys()
    layer.load_state_dict(reference.state_dict())  # strict: every key, every shape
    back = torch.nn.Linear(24, 40)
    back.load_state_dict(layer.state_dict())
    for name, value in reference.state_dict().items():
        assert torch.equal(back.state_dict()[name], value), name
        assert layer.state_dict()[name].shape == value.shape, name


def test_parameters_as_nn_linears():
    for dtype in (None, torch.float64):
        layer, reference = day87_fast.Linear(8, 4, dtype=dtype), torch.nn.Linear(8, 4, dtype=dtype)
        assert [(name, p.shape, p.dtype) for name, p in layer.named_parameters()] == \
            [(name, p.shape, p.dtype) for name, p in reference.named_parameters()]
    # FP16 parameters: the weight FP16, the bias kept in the kernel's accumulate dtype.
    half = day87_fast.Linear(8, 4, dtype=torch.float16)
    assert (half.weight.dtype, half.bias.dtype) == (torch.float16, torch.float32)
    assert day87_fast.Linear(8, 4, bias=False).bias is None


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
@pytest.mark.parametrize("batch", [(7,), (2, 3), (1,), (129,), ()],
                         ids=["7 rows", "2 x 3", "1 row", "129 rows", "one vector"])
def test_cpu_output_and_gradients_equal_nn_linears(batch, bias):
    assert differences_from_nn_linear(batch, bias) == []


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_equality_catches_a_column_major_b_read_row_major(bias):
    assert "output" in differences_from_nn_linear((7,), bias, ReadsWeightRowMajor)


def test_cpu_computes_in_float64_from_fp32_parameters():
    reference, layer = twins(24, 40, dtype=torch.float32)
    x = torch.randn(5, 24)
    got = layer(x)
    assert got.dtype == torch.float64
    expected = torch.nn.functional.linear(x.double(), reference.weight.double(),
                                          reference.bias.double())
    torch.testing.assert_close(got, expected)


class OperandsSeen(TorchDispatchMode):
    """Records the b that each call of a day87_fast operator receives."""

    def __init__(self):
        super().__init__()
        self.b_operands = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.namespace == "day87_fast":
            self.b_operands.append(args[1])
        return func(*args, **(kwargs or {}))


def weight_copies(profile, weight):
    """The copying ops in `profile` whose input has the weight's shape or its transpose's
    (addmm's copy of the bias into each output row is no copy of the weight)."""
    shapes = [list(weight.shape), list(reversed(weight.shape))]
    return [f"{event.name} of {event.input_shapes}" for event in profile.events()
            if event.name in COPYING_OPS and any(shape in shapes for shape in event.input_shapes)]


def copies_of_the_weight(layer, call=None, rows=7):
    """What copies the weight in a forward and backward on the CPU: a b that is not the
    weight's memory, read in place; a copying op on a tensor of the weight's shape."""
    call = layer if call is None else call
    # .grad None, as zero_grad leaves it: AccumulateGrad then takes the new gradient as it
    # is where its layout is the weight's, and copies it where not.
    layer.zero_grad()
    x = torch.randn(rows, layer.in_features, dtype=torch.float64, requires_grad=True)
    # Dense: an expanded gradient (that of .sum()) would be copied by mm itself.
    grad = torch.randn(rows, layer.out_features, dtype=torch.float64)
    seen = OperandsSeen()
    with torch.profiler.profile(record_shapes=True) as profile:
        if call is layer:  # eager: the dispatch mode sees each operand
            with seen:
                output = call(x)
        else:  # compiled: no dispatch mode under torch.compile; the profile alone
            output = call(x)
        output.backward(grad)
    weight = layer.weight
    problems = weight_copies(profile, weight)
    problems += [f"b is not the weight's memory, read in place: {b.data_ptr():#x} with strides "
                 f"{b.stride()}, the weight {weight.data_ptr():#x} with strides {weight.stride()}"
                 for b in seen.b_operands
                 if b.data_ptr() != weight.data_ptr() or b.stride() != weight.t().stride()]
    if weight.grad.stride() != weight.stride():
        problems.append(f"the weight's gradient has strides {weight.grad.stride()}")
    return problems


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no bias"])
def test_no_copy_of_the_weight_on_the_cpu(bias):
    _, layer = twins(24, 40, bias=bias)
    assert copies_of_the_weight(layer) == []


def test_no_copy_check_catches_a_layer_that_copies_the_transpose(monkeypatch):
    # The layer that no implementation reads column-major for: weight.t().contiguous().
    monkeypatch.setattr(layouts, "READS_COLUMN_MAJOR_B", frozenset())
    _, layer = twins(24, 40)
    problems = copies_of_the_weight(layer)
    assert any("aten::clone" in problem for problem in problems), problems
    assert any("not the weight's memory" in problem for problem in problems), problems


def test_no_copy_check_catches_a_row_major_gradient_of_b(monkeypatch):
    # The lesson's formula for every b: grad_b = a^T @ grad, row-major, which AccumulateGrad
    # copies into the weight's layout.
    monkeypatch.setattr(layouts, "column_major_only", lambda matrix: False)
    _, layer = twins(24, 40)
    problems = copies_of_the_weight(layer)
    assert any("aten::copy_" in problem for problem in problems), problems


def test_compiled_dynamic_batch_equals_nn_linear_and_copies_nothing():
    from torch._dynamo.testing import CompileCounterWithBackend
    torch._dynamo.reset()
    reference, layer = twins(24, 40)
    # aot_eager traces as inductor does, with fake tensors, and runs eager's kernels: the
    # profile shows each op the compiled graph runs. (Dynamo specialises a size of 1, so a
    # one-row batch would add a graph; eager's tests above take it.)
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(layer, fullgraph=True, dynamic=True, backend=counter)
    for rows in (7, 129, 3):
        x = torch.randn(rows, 24, dtype=torch.float64, requires_grad=True)
        grad = torch.randn(rows, 40, dtype=torch.float64)
        expected, got = reference(x), compiled(x)
        torch.testing.assert_close(got, expected)
        ours = torch.autograd.grad(got, [x, *layer.parameters()], grad)
        theirs = torch.autograd.grad(expected, [x, *reference.parameters()], grad)
        for mine, other in zip(ours, theirs):
            torch.testing.assert_close(mine, other)
    assert counter.frame_count == 1, f"{counter.frame_count} graphs for one dynamic batch"
    assert copies_of_the_weight(layer, call=compiled, rows=5) == []
