"""forward_variants.py: how version 1's tile plans and its split of K were chosen.

From fast/:
    python -m bench.forward_variants             (needs a GPU)
    python -m bench.forward_variants Square      only the variants whose names hold "Square"
    python -m bench.forward_variants --splits    the split-K choice: each plan at the
                                                 small shapes with 1 to 16 splits of K
    python -m bench.forward_variants --splits SmallGrid   the same for the named variants

fast/csrc/version1_wmma.cuh's kernel is one template over a TilePlan (block tile, warp tile,
stage depth, stage count). Each variant below is one of its plans, selected by its
template parameter, launched through the file's own launchPlan or, for the two that
measure a part, its kernel launched alone; nothing is edited. The tool checks each
variant against float64 at a shape with several tile groups and a K tail (a variant
made wrong on purpose must fail), and times each beside cuBLAS at the same precision
contract (FP16 in, FP32 accumulate and out), with timing.py's throughput method: fresh
random inputs rotated past the L2, medians of CUDA event timings. The plans that lost
are in git's history, and their figures in fast/NOTES.md.
"""

import argparse
import os
import sys

import torch

SOURCES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "csrc")

# How a variant launches its plan.
PLAN = "through launchPlan, as the launcher launches it"
IN_ORDER = "the reduction launched in stream order, not as the multiply's dependent"
MULTIPLY_ONLY = "the multiply alone: what the reduction costs (timing only; wrong where split)"
LAST_STAGE_DROPPED = "the multiply alone, K's last stage left out: wrong on purpose"
LAUNCHES = {
    PLAN: "version1::launchPlan<version1::{plan}>(operands, splits, workspace, "
          "facts.sm90_code, stream)",
    IN_ORDER: "version1::launchPlan<version1::{plan}>(operands, splits, workspace, false, stream)",
    MULTIPLY_ONLY: "multiplyAlone<version1::{plan}>(operands, splits, workspace, 0, stream)",
    LAST_STAGE_DROPPED: "multiplyAlone<version1::{plan}>(operands, 1, workspace, 1, stream)",
}

# name: (the plan's name in version1_wmma.cuh, how it is launched)
VARIANTS = {
    "SquarePlan 128x128, 3 x 32": ("SquarePlan", PLAN),
    "SmallGridPlan 64x64, 32x32 warps, 3 x 32": ("SmallGridPlan", PLAN),
    "TuringPlan 128x128, 2 x 16": ("TuringPlan", PLAN),
    "SquarePlan, no last stage (must fail)": ("SquarePlan", LAST_STAGE_DROPPED),
    "SmallGridPlan, reduction in stream order": ("SmallGridPlan", IN_ORDER),
    "SmallGridPlan, no reduction (timing only)": ("SmallGridPlan", MULTIPLY_ONLY),
}
SPLIT_SHAPES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 512),
                (256, 512, 4096)]
SPLIT_COUNTS = [1, 2, 3, 4, 6, 8, 12, 16]
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (8192, 4096, 1024)]
CHECK_SHAPE = (2304, 1280, 1040)  # M and N multiples of 256, K % 32 == 16: a tail stage

# Plain CUDA (no torch): fast/'s launcher file, whose includes bring both versions, and
# every variant's launch behind one function. The operands are filled member by member,
# so that the bias stays unset (nullptr: no bias); K is split as the caller says
# (workspace: splits x M x N floats).
VARIANTS_SOURCE = """#include "launch_policy.cu"

namespace tuned {
// A plan's multiply launched as launchPlan launches it, without the reduction, its
// last `dropped` stages of K left out.
template <class Plan>
cudaError_t multiplyAlone(const FastGemmOperands& operands, int splits, float* workspace,
                          int dropped, cudaStream_t stream) {
    cudaError_t status = cudaFuncSetAttribute(version1::wmmaGemmKernel<Plan>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;
    const int per_split = (k_tiles + splits - 1) / splits;
    splits = per_split ? (k_tiles + per_split - 1) / per_split : 1;
    const dim3 blocks((operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN), splits);
    version1::wmmaGemmKernel<Plan><<<blocks, Plan::kThreads, Plan::kSharedBytes, stream>>>(
        operands, splits > 1 ? workspace : nullptr, (splits > 1 ? per_split : k_tiles) - dropped);
    return cudaGetLastError();
}
}  // namespace tuned

cudaError_t run_variant(int index, const half* a, const half* b, float* c, int m, int n, int k,
                        int splits, float* workspace, cudaStream_t stream) {
    using namespace tuned;
    DeviceFacts facts;
    const cudaError_t status = currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    FastGemmOperands operands{};
    operands.a = a;
    operands.b = b;
    operands.c = c;
    operands.m = m;
    operands.n = n;
    operands.k = k;
    switch (index) {
%s
    }
    return cudaErrorInvalidValue;
}
"""

BINDING = """
#include <torch/extension.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
%s
void run_plan(int64_t index, torch::Tensor a, torch::Tensor b, torch::Tensor c, int64_t splits,
              torch::Tensor workspace) {
    const c10::cuda::CUDAGuard guard(a.device());
    const cudaError_t status = run_variant(
        static_cast<int>(index), reinterpret_cast<const half*>(a.data_ptr<at::Half>()),
        reinterpret_cast<const half*>(b.data_ptr<at::Half>()), c.data_ptr<float>(), a.size(0),
        b.size(1), a.size(1), static_cast<int>(splits), workspace.data_ptr<float>(),
        c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(status == cudaSuccess, "variant ", index, ": ", cudaGetErrorString(status));
}
"""


def variants_source(variants):
    """The plain CUDA that launches `variants`, each by its index in the dict."""
    cases = "\n".join(f"        case {index}: return " + LAUNCHES[how].format(plan=plan) + ";"
                      for index, (plan, how) in enumerate(variants.values()))
    return VARIANTS_SOURCE % cases


def build(variants):
    # Imported here, where a GPU is: its import warns "No CUDA runtime is found" wherever none is.
    from torch.utils import cpp_extension
    # The sources include fast/'s files: ninja's dependency file rebuilds the extension
    # when one of them changes.
    return cpp_extension.load_inline(
        "day87_forward_variants",
        cpp_sources="void run_plan(int64_t, torch::Tensor, torch::Tensor, torch::Tensor, int64_t, "
                    "torch::Tensor);",
        cuda_sources=BINDING % variants_source(variants), functions=["run_plan"],
        extra_cuda_cflags=["-O3"], extra_include_paths=[SOURCES], verbose=False)


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only the variants whose names hold one of these")
    parser.add_argument("--splits", action="store_true",
                        help="the split-K table instead of the main one")
    arguments = parser.parse_args()
    if not torch.cuda.is_available():  # said before anything builds
        print("forward_variants.py needs a GPU; nothing to measure here.")
        return
    from bench import bench  # cuBLAS at the same precision contract, and the fast tier's build
    from bench import timing  # how a call is timed, and the input sets rotated past the L2
    from tests import lesson_folder  # noqa: F401  the lesson's test_op.py importable
    import test_op  # the error bound: error_ratio

    wanted = arguments.names
    if arguments.splits and not wanted:
        wanted = [name for name in VARIANTS if "must fail" not in name]
    variants = {name: variant for name, variant in VARIANTS.items()
                if not wanted or any(part in name for part in wanted)}
    extension = build(variants)

    def plan_call(index, splits=1):
        def call(a, b):
            c = torch.empty(a.shape[0], b.shape[1], device=a.device, dtype=torch.float32)
            workspace = torch.empty(splits * c.numel() if splits > 1 else 1, device=a.device)
            extension.run_plan(index, a, b, c, splits, workspace)
            return c
        return call

    if arguments.splits:
        return split_table(variants, plan_call, bench, timing, test_op)

    cublas = bench.baseline()
    base, base_name = cublas.function, cublas.label
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"baseline {base_name}, TFLOP/s (ratio to the baseline)")
    m, n, k = CHECK_SHAPE
    a = torch.randn(m, k, device="cuda", dtype=torch.half)
    b = torch.randn(k, n, device="cuda", dtype=torch.half)
    width = max(map(len, variants)) + 2  # the name column
    header = f"{'variant':<{width}}{'error at ' + 'x'.join(map(str, CHECK_SHAPE)):>22}"
    print(header + "".join(f"{'x'.join(map(str, shape)):>22}" for shape in SHAPES))
    rows = [("cuBLAS", None, base)] + [
        (name, index, plan_call(index)) for index, name in enumerate(variants)
        if "timing only" not in name]  # those are for the split table
    baseline_ms = {}
    unexpected = 0  # a variant that fails the check, or a "must fail" one that passes it
    for name, index, call in rows:
        line = f"{name:<{width}}"
        if index is None:
            line += f"{'':>22}"
        else:
            ratio = test_op.error_ratio(call(a, b), a, b)
            line += (f"{100 * ratio:>20.1f}% " if ratio <= 1
                     else f"{'FAIL ' + format(ratio, '.3g'):>22}")
            must_fail = "must fail" in name
            unexpected += (ratio <= 1) == must_fail
            if must_fail:  # a wrong kernel is not timed
                print(line + ("  caught" if ratio > 1 else "  NOT CAUGHT"), flush=True)
                continue
        for shape in SHAPES:
            sets = timing.input_sets(*shape)
            ms = timing.milliseconds_per_call(call, sets)
            baseline_ms.setdefault(shape, ms)
            tflops = 2.0 * shape[0] * shape[1] * shape[2] / ms / 1e9
            line += f"{tflops:>14.1f} ({baseline_ms[shape] / ms:.2f})"
            del sets
        print(line, flush=True)
    if unexpected:
        print(f"forward_variants: {unexpected} variant(s) with an unexpected check result")
        sys.exit(1)


def split_table(variants, plan_call, bench, timing, test_op):
    """GPU time (CUDA-graph replays, operands in L2) of each plan at the small shapes
    with K in 1 to 16 splits, beside cuBLAS and the launcher's own choice."""
    import day87_fast
    cublas = bench.baseline()
    base, base_name = cublas.function, cublas.label
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; "
          "microseconds per call, "
          f"graph replays, operands in L2; day87_fast.wmma_mm is the launcher's own choice")
    one = torch.zeros(1, device="cuda")
    print(f"the floor, a kernel that does next to nothing (a one-element add_): "
          f"{timing.graph_microseconds(lambda: one.add_(1)):.2f}")
    for index, name in enumerate(variants):
        print(f"\n{name}")
        print(f"{'M x N x K':<18}{base_name:>24}{'day87_fast.wmma_mm':>20}"
              + "".join(f"{s:>8}" for s in SPLIT_COUNTS))
        for m, n, k in SPLIT_SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.half)
            b = torch.randn(k, n, device="cuda", dtype=torch.half)
            line = (f"{f'{m}x{n}x{k}':<18}{timing.graph_microseconds(lambda: base(a, b)):>24.2f}"
                    f"{timing.graph_microseconds(lambda: day87_fast.wmma_mm(a, b)):>20.2f}")
            for splits in SPLIT_COUNTS:
                call = plan_call(index, splits)
                if "timing only" not in name and test_op.error_ratio(call(a, b), a, b) > 1:
                    line += f"{'FAIL':>8}"
                    continue
                line += f"{timing.graph_microseconds(lambda: call(a, b)):>8.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
