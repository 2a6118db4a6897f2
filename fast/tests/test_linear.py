"""test_linear.py: day87_fast.Linear drops in for torch.nn.Linear, checked on the CPU.

    cd fast && python -m pytest tests/test_linear.py

- An nn.Linear's state_dict loads into it, and its state_dict back into an nn.Linear.
- In float64 on the CPU, its output and its gradients (input, weight, bias) equal
  nn.Linear's, for a batch of any shape and size.
- Its parameters' dtypes are nn.Linear's; on the CPU it computes in float64.
"""

import pytest
import torch

import day87_fast  # the installed package


def twins(in_features, out_features, bias=True, dtype=torch.float64):
    """An nn.Linear and a day87_fast.Linear holding the same parameters."""
    torch.manual_seed(0)
    reference = torch.nn.Linear(in_features, out_features, bias=bias, dtype=dtype)
    layer = day87_fast.Linear(in_features, out_features, bias=bias, dtype=dtype)
    layer.load_state_dict(reference.state_dict())
    return reference, layer


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
@pytest.mark.parametrize("batch", [(7,), (2, 3), (1,), ()], ids=["7 rows", "2 x 3", "1 row",
                                                                  "one vector"])
def test_cpu_output_and_gradients_equal_nn_linears(batch, bias):
    reference, layer = twins(24, 40, bias=bias)
    x = torch.randn(*batch, 24, dtype=torch.float64, requires_grad=True)
    expected, got = reference(x), layer(x)
    assert got.dtype == torch.float64 and got.shape == expected.shape
    torch.testing.assert_close(got, expected)
    grad = torch.randn_like(expected)
    wanted = ["input", "weight"] + ["bias"] * bias
    theirs = torch.autograd.grad(expected, [x, *reference.parameters()], grad)
    ours = torch.autograd.grad(got, [x, *layer.parameters()], grad)
    for name, mine, other in zip(wanted, ours, theirs):
        torch.testing.assert_close(mine, other, msg=lambda text, name=name: f"{name}: {text}")


def test_cpu_computes_in_float64_from_fp32_parameters():
    reference, layer = twins(24, 40, dtype=torch.float32)
    x = torch.randn(5, 24)
    got = layer(x)
    assert got.dtype == torch.float64
    expected = torch.nn.functional.linear(x.double(), reference.weight.double(),
                                          reference.bias.double())
    torch.testing.assert_close(got, expected)
