"""b's layouts: which device's implementation reads b column-major, where day87_fast's
contract will depart from the lesson's.

nn.Linear keeps its weight W as (out, in) and computes x @ W.t(). W.t() is a (K, N) view
with strides (1, K): b column-major. The lesson refuses it (rule 'contiguous'), so a layer
that passes it would copy its whole weight at every call. No implementation reads a
column-major b yet: day87_fast.Linear makes that copy itself, explicitly, on every device.
"""

# The device types whose implementation of wmma_mm and wmma_mm_bias reads a column-major b.
READS_COLUMN_MAJOR_B = frozenset()


def reads_column_major_b(device):
    """Whether the operators take b column-major on `device` (a torch.device)."""
    return device.type in READS_COLUMN_MAJOR_B
