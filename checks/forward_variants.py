"""forward_variants.py: how the forward's tile plans were chosen.

    python checks/forward_variants.py        (needs a GPU)

kernel.cu's kernel is one template over a TilePlan (block tile, stage depth, stage
count). This tool instantiates the plans below from kernel.cu itself, checks each
against float64 at a shape with several tile groups and a K tail, and times each
beside cuBLAS at the same precision contract (FP16 in, FP32 accumulate and out),
with bench.py's method: fresh random inputs rotated past the L2, medians of CUDA
event timings. Each plan's figure, prediction and outcome go into checks/NOTES.md.
"""

import os
import sys

import torch
import torch.utils.cpp_extension

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402  (its timing method and input sets)
import test_op  # noqa: E402  (the error bound, error_ratio)

LESSON = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (BlockM, BlockN, BlockK, Stages), as kernel.cu's TilePlan takes them.
PLANS = {
    "SquarePlan 128x128, 3 x 32": (128, 128, 32, 3),
    "WidePlan 256x128, 3 x 32": (256, 128, 32, 3),
    "128x256, 3 x 32": (128, 256, 32, 3),
    "256x128, 4 x 32": (256, 128, 32, 4),
    "256x128, 2 x 64": (256, 128, 64, 2),
    "256x128, 3 x 64": (256, 128, 64, 3),
    "TuringPlan 128x128, 2 x 16": (128, 128, 16, 2),
}
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (8192, 4096, 1024)]
CHECK_SHAPE = (2304, 1280, 1040)  # M and N multiples of 256, K % 32 == 16: a tail stage

SOURCE = """
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include "kernel.cu"

void run_plan(int64_t index, torch::Tensor a, torch::Tensor b, torch::Tensor c) {
    const c10::cuda::CUDAGuard guard(a.device());
    auto stream = c10::cuda::getCurrentCUDAStream();
    const auto* pa = reinterpret_cast<const half*>(a.data_ptr<at::Half>());
    const auto* pb = reinterpret_cast<const half*>(b.data_ptr<at::Half>());
    const int m = a.size(0), n = b.size(1), k = a.size(1);
    cudaError_t status = cudaErrorInvalidValue;
    switch (index) {
%s
    }
    TORCH_CHECK(status == cudaSuccess, "plan ", index, ": ", cudaGetErrorString(status));
}
"""


def build():
    cases = "\n".join(
        f"        case {index}: status = launchPlan<TilePlan<{m}, {n}, {k}, {s}>>"
        f"(pa, pb, c.data_ptr<float>(), m, n, k, stream); break;"
        for index, (m, n, k, s) in enumerate(PLANS.values()))
    return torch.utils.cpp_extension.load_inline(
        "day87_forward_variants", cpp_sources="void run_plan(int64_t, torch::Tensor, torch::Tensor, torch::Tensor);",
        cuda_sources=SOURCE % cases, functions=["run_plan"], extra_include_paths=[LESSON],
        extra_cuda_cflags=["-O3"], verbose=False)


def main():
    if not torch.cuda.is_available():
        print("forward_variants.py needs a GPU; nothing to measure here.")
        return
    extension = build()

    def plan_call(index):
        def call(a, b):
            c = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
            extension.run_plan(index, a, b, c)
            return c
        return call

    base, base_name = bench.baseline()
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"baseline {base_name}, TFLOP/s (ratio to the baseline)")
    m, n, k = CHECK_SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.half)
    b = torch.randn(k, n, device="cuda", dtype=torch.half)
    header = f"{'plan':<30}{'error at ' + 'x'.join(map(str, CHECK_SHAPE)):>22}"
    print(header + "".join(f"{'x'.join(map(str, shape)):>22}" for shape in SHAPES))
    rows = [("cuBLAS", None, base)] + [(name, index, plan_call(index)) for index, name in enumerate(PLANS)]
    baseline_ms = {}
    for name, index, call in rows:
        line = f"{name:<30}"
        if index is None:
            line += f"{'':>22}"
        else:
            ratio = test_op.error_ratio(call(a, b), a, b)
            line += f"{100 * ratio:>20.1f}% " if ratio <= 1 else f"{'FAIL ' + format(ratio, '.3g'):>22}"
        for shape in SHAPES:
            sets = bench.input_sets(*shape)
            ms = bench.milliseconds_per_call(call, sets)
            baseline_ms.setdefault(shape, ms)
            tflops = 2.0 * shape[0] * shape[1] * shape[2] / ms / 1e9
            line += f"{tflops:>14.1f} ({baseline_ms[shape] / ms:.2f})"
            del sets
        print(line, flush=True)


if __name__ == "__main__":
    main()
