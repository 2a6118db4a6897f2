"""triton_peer.py: the Triton peer of bench.py's tables A and D: c = a @ b, and
c = a @ b + bias with the bias added in the kernel's epilogue, FP16 in, FP32
accumulation, FP32 out. What a day 88 user would write next, with the triton that
torch's CUDA wheels ship.

    from bench import triton_peer   (from fast/)
    c = triton_peer.matmul(a, b)              # a (M x K), b (K x N) FP16; c (M x N) FP32
    c = triton_peer.matmul_bias(a, b, bias)   # bias (N) FP32, added before the store

a and b may have any strides (nn.Linear's weight.t() is a column-major b) and any
M, N and K: the tiles at the edges are masked. One kernel, gemm_kernel, does both; the
autotuner picks its tiles per shape, layout and bias-or-not on the first call.

On the GPU only; on the CPU only under TRITON_INTERPRET=1, set before triton is first
imported (tests/test_triton_peer.py runs it so, against float64).
"""

import contextlib

import torch
import triton
import triton.language as tl

# Whether the kernel below runs in Triton's interpreter (numpy, on the CPU): triton.jit
# reads TRITON_INTERPRET when it decorates a kernel, at this module's import, as here.
INTERPRETED = triton.knobs.runtime.interpret

# The tiles tried (output rows, columns, K per step), warps per tile and pipeline stages:
# six of the FP16 configurations in Triton's matmul tutorial
# (python/tutorials/03-matrix-multiplication.py, get_cuda_autotune_config). The large tiles
# with deep pipelines are for large shapes on Hopper; the small ones give more SMs a tile at
# small shapes (the lesson's 256 x 512 x 384 has 8 tiles of 128 x 128) and need less shared
# memory, for a T4. A block may have 227 KiB of shared memory on an H100 or H200, 64 KiB on
# a T4: a configuration that needs more than its card gives fails at its first launch
# (OutOfResources), and the autotuner, which counts that as infinitely slow, chooses among
# the others.
# GROUP_ROWS: how many rows of tiles a group walks down before moving to the next columns
# (the tutorial's GROUP_SIZE_M), so that neighbouring programs share tiles of a and b in L2.
CONFIGS = [
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64, "GROUP_ROWS": 8},
                  num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 256, "BLOCK_K": 32, "GROUP_ROWS": 8},
                  num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_ROWS": 8},
                  num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 64, "BLOCK_K": 32, "GROUP_ROWS": 8},
                  num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 32, "GROUP_ROWS": 8},
                  num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_ROWS": 8},
                  num_warps=2, num_stages=5),
]

# The kernel computes its element offsets (row * stride + column * stride) in 32 bits,
# as the tutorial does; an operand whose farthest element lies past this is refused.
LARGEST_OFFSET = 2**31 - 1


# Tuned again for each shape and each layout of b (its strides: a column-major b may
# want other tiles); the autotuner adds the dtypes of the tensor arguments to the key,
# so the fused kernel (a bias tensor) and the plain one (bias None) are tuned apart.
@triton.autotune(configs=CONFIGS, key=["M", "N", "K", "stride_bk", "stride_bn"])
@triton.jit
def gemm_kernel(a_ptr, b_ptr, bias_ptr, c_ptr, M, N, K,
                stride_am, stride_ak, stride_bk, stride_bn, stride_bias, stride_cm, stride_cn,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_ROWS: tl.constexpr):
    """One BLOCK_M x BLOCK_N tile of c = a @ b (+ bias) per program. bias_ptr is None
    for the plain product: Triton compiles a kernel per None-or-pointer, and the bias's
    branch below is decided when the kernel is compiled, not at run time."""
    # Which tile: programs are numbered along a group of GROUP_ROWS rows of tiles, column
    # by column, rather than along a whole row of tiles, so that programs running at the
    # same time read the same few tiles of a and b (the tutorial's "L2 cache" ordering).
    program = tl.program_id(axis=0)
    tile_rows = tl.cdiv(M, BLOCK_M)
    tile_columns = tl.cdiv(N, BLOCK_N)
    programs_per_group = GROUP_ROWS * tile_columns
    first_row = (program // programs_per_group) * GROUP_ROWS
    rows_in_group = min(tile_rows - first_row, GROUP_ROWS)  # the last group may be shorter
    tile_row = first_row + (program % programs_per_group) % rows_in_group
    tile_column = (program % programs_per_group) // rows_in_group

    # The tile's rows of a and columns of b. Those past M or N (in the edge tiles) wrap
    # round to ones that exist, so that these loads need no mask and stay inside the
    # tensors; what they produce falls outside c, and the store's mask drops it.
    rows = tile_row * BLOCK_M + tl.arange(0, BLOCK_M)
    columns = tile_column * BLOCK_N + tl.arange(0, BLOCK_N)
    a_rows = rows % M
    b_columns = columns % N
    steps = tl.arange(0, BLOCK_K)
    a_tile = a_ptr + a_rows[:, None] * stride_am + steps[None, :] * stride_ak
    b_tile = b_ptr + steps[:, None] * stride_bk + b_columns[None, :] * stride_bn

    # FP32 accumulation: tl.dot multiplies the FP16 tiles on the tensor cores and adds
    # into this FP32 accumulator, the precision contract of wmma_mm and of cuBLAS's
    # out_dtype=torch.float32 line.
    accumulator = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for step in range(0, tl.cdiv(K, BLOCK_K)):
        # The last step's columns of a and rows of b past K are loaded as zeros, so that
        # they add nothing (wrapped round, they would add products a second time).
        left = K - step * BLOCK_K
        a = tl.load(a_tile, mask=steps[None, :] < left, other=0.0)
        b = tl.load(b_tile, mask=steps[:, None] < left, other=0.0)
        accumulator = tl.dot(a, b, accumulator)
        a_tile += BLOCK_K * stride_ak
        b_tile += BLOCK_K * stride_bk

    # The epilogue: the bias, one FP32 value per column, added in registers before the
    # one store of c, rather than read back and written again by a second kernel.
    if bias_ptr is not None:
        bias = tl.load(bias_ptr + b_columns * stride_bias)
        accumulator += bias[None, :]
    c_tile = c_ptr + rows[:, None] * stride_cm + columns[None, :] * stride_cn
    tl.store(c_tile, accumulator, mask=(rows[:, None] < M) & (columns[None, :] < N))


def matmul(a, b):
    """c = a @ b: a (M x K) and b (K x N) FP16, any strides; c (M x N) FP32."""
    return launch("triton_peer.matmul", a, b, None)


def matmul_bias(a, b, bias):
    """c = a @ b + bias, the bias (N) FP32 added in the kernel's epilogue; c FP32."""
    return launch("triton_peer.matmul_bias", a, b, bias)


def launch(name, a, b, bias):
    check_operands(name, a, b, bias)
    (rows, depth), columns = a.shape, b.shape[1]
    c = torch.empty(rows, columns, device=a.device, dtype=torch.float32)

    def grid(config):  # one program per tile of c, the tile's size chosen by the autotuner
        return (triton.cdiv(rows, config["BLOCK_M"]) * triton.cdiv(columns, config["BLOCK_N"]),)

    # Triton launches on the current CUDA device: make it the operands'. The interpreter,
    # on the CPU, has no device to set.
    with torch.cuda.device(a.device) if a.is_cuda else contextlib.nullcontext():
        gemm_kernel[grid](a, b, bias, c, rows, columns, depth, a.stride(0), a.stride(1),
                          b.stride(0), b.stride(1), 0 if bias is None else bias.stride(0),
                          c.stride(0), c.stride(1))
    return c


def check_operands(name, a, b, bias):
    """Each rule the kernel relies on, refused by name with the values seen."""
    operands = {"a": a, "b": b} | ({} if bias is None else {"bias": bias})

    def described():
        return ", ".join(f"{key}: {tuple(value.shape)} {str(value.dtype).replace('torch.', '')} "
                         f"on {value.device}" for key, value in operands.items())

    for key, value in operands.items():
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"{name}: rule 'tensors': {key} must be a torch.Tensor; "
                            f"got {type(value).__name__}")
    if a.dim() != 2 or b.dim() != 2 or (bias is not None and bias.dim() != 1):
        raise ValueError(f"{name}: rule 'two matrices': a and b must be 2-D"
                         + ("" if bias is None else ", bias 1-D") + f"; got {described()}")
    if a.dtype != torch.float16 or b.dtype != torch.float16 or (
            bias is not None and bias.dtype != torch.float32):
        raise TypeError(f"{name}: rule 'dtype': a and b must be float16"
                        + ("" if bias is None else ", bias float32")
                        + f" (FP16 in, FP32 out); got {described()}")
    if len({value.device for value in operands.values()}) != 1:
        raise ValueError(f"{name}: rule 'one device': the operands must be on one device; "
                         f"got {described()}")
    if not a.is_cuda and not INTERPRETED:
        raise ValueError(f"{name}: rule 'CUDA': a Triton kernel runs on the GPU (on the CPU "
                         f"only under TRITON_INTERPRET=1, set before triton is imported); "
                         f"got {described()}")
    if a.shape[1] != b.shape[0] or (bias is not None and bias.shape[0] != b.shape[1]):
        raise ValueError(f"{name}: rule 'inner dimensions': a's columns must equal b's rows"
                         + ("" if bias is None else ", and bias must have b's columns")
                         + f"; got {described()}")
    for key, value in operands.items():
        farthest = sum((size - 1) * stride for size, stride in zip(value.shape, value.stride()))
        if value.numel() and farthest > LARGEST_OFFSET:
            raise ValueError(f"{name}: rule '32-bit offsets': every element of {key} must lie "
                             f"within {LARGEST_OFFSET} elements of its first; its farthest is "
                             f"{farthest} (shape {tuple(value.shape)}, strides {value.stride()})")
