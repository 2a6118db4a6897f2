"""test_export.py: torch.export sees the tile rule through the fake implementation.

    python -m pytest checks/test_export.py

Needs no GPU: the example inputs are fake CUDA tensors, which have shapes, dtypes
and devices and no memory.
"""

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.symbolic_shapes import ShapeEnv

import op


class Layer(torch.nn.Module):
    def forward(self, a, b):
        return op.wmma_mm(a, b)


def fake_cuda_inputs():
    with FakeTensorMode(shape_env=ShapeEnv(), allow_non_fake_inputs=True):
        return (torch.empty(256, 16, dtype=torch.half, device="cuda"),
                torch.empty(16, 128, dtype=torch.half, device="cuda"))


def test_a_dynamic_m_must_be_a_multiple_of_the_tile():
    """An M of any size is refused at export, with the fix; M = 128 * tiles exports."""
    inputs = fake_cuda_inputs()
    with pytest.raises(Exception, match=rf"% {op.TILE_M}\) == 0"):
        torch.export.export(Layer(), inputs,
                            dynamic_shapes={"a": {0: torch.export.Dim("M")}, "b": None})
    exported = torch.export.export(
        Layer(), inputs,
        dynamic_shapes={"a": {0: op.TILE_M * torch.export.Dim("M_tiles")}, "b": None})
    assert exported.module() is not None
