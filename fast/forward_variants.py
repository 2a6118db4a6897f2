"""forward_variants.py: how the fast tier's tile plans were chosen.

    python fast/forward_variants.py              (needs a GPU)
    python fast/forward_variants.py Plan         only the variants whose names hold "Plan"
    python fast/forward_variants.py --splits     the split-K choice: each plan at the
                                                 small shapes with 1 to 16 splits of K
    python fast/forward_variants.py --splits 64x64   the same for the named variants

fast/kernel.cu's kernel is one template over a TilePlan (block tile, warp tile, stage
depth, stage count). Each variant below is fast/kernel.cu itself, as it is on disk, cut
before its plan launcher, with a plan and with the source edits listed, in a namespace
of its own; the lesson's kernel.cu, which fast/kernel.cu includes, comes once before
them all, outside every namespace. The tool checks each variant against float64 at a
shape with several tile groups and a K tail, and times each beside cuBLAS at the same
precision contract (FP16 in, FP32 accumulate and out), with timing.py's throughput
method: fresh random inputs rotated past the L2, medians of CUDA event timings. Each plan's figure,
prediction and outcome go into checks/NOTES.md.
"""

import argparse
import os
import re
import sys

import torch

FAST = os.path.dirname(os.path.abspath(__file__))
LESSON = os.path.dirname(FAST)

# Source edits a variant makes to fast/kernel.cu: (what it says, the text replaced, the text put in).
PRELOAD_B = ("all four B fragments loaded before the MMAs", """            // One B fragment at a time, each feeding four MMAs: loading all four
            // first compiled to the same registers and measured no faster.
#pragma unroll
            for (int j = 0; j < Plan::kFragmentsN; ++j) {
                wmma::fragment<wmma::matrix_b, kWmmaSize, kWmmaSize, kWmmaSize, half,
                               wmma::row_major>
                    b_fragment;
                wmma::load_matrix_sync(b_fragment,
                                       stage_b + k_step * Plan::kStrideB + j * kWmmaSize,
                                       Plan::kStrideB);
#pragma unroll
                for (int i = 0; i < Plan::kFragmentsM; ++i)
                    wmma::mma_sync(accumulators[i][j], a_fragments[i], b_fragment,
                                   accumulators[i][j]);
            }""", """            wmma::fragment<wmma::matrix_b, kWmmaSize, kWmmaSize, kWmmaSize, half,
                           wmma::row_major>
                b_fragments[Plan::kFragmentsN];
#pragma unroll
            for (int j = 0; j < Plan::kFragmentsN; ++j)
                wmma::load_matrix_sync(b_fragments[j],
                                       stage_b + k_step * Plan::kStrideB + j * kWmmaSize,
                                       Plan::kStrideB);
#pragma unroll
            for (int j = 0; j < Plan::kFragmentsN; ++j)
#pragma unroll
                for (int i = 0; i < Plan::kFragmentsM; ++i)
                    wmma::mma_sync(accumulators[i][j], a_fragments[i], b_fragments[j],
                                   accumulators[i][j]);""")
THREE_BLOCKS = ("three blocks per SM (registers capped at 168)", "__launch_bounds__(Plan::kThreads)",
                "__launch_bounds__(Plan::kThreads, 3)")
# A T4 SM (64 KB) holds one SquarePlan block; an H200 SM (227 KB) holds two. Asking for
# 120 KB of shared memory per block leaves room for one on the H200 too.
ONE_BLOCK = ("one block per SM, as on a T4", "Plan::kSharedBytes", "(120 * 1024)")
# A deliberately wrong kernel, so that the check column is seen to fail: no last stage.
LAST_STAGE_DROPPED = ("the last stage dropped",
                      "(k + Plan::kBlockK - 1) / Plan::kBlockK - first_k_tile);",
                      "(k + Plan::kBlockK - 1) / Plan::kBlockK - first_k_tile) - 1;")
# kGroupRows is the lesson's, in kernel.cu; the variant's own, declared in the kernel,
# hides it there.
GROUPS_16 = ("16 block-rows per group", "    const int tiles_per_group = kGroupRows * tiles_n;\n",
             "    constexpr int kGroupRows = 16;\n    const int tiles_per_group = kGroupRows * tiles_n;\n")
TWO_BLOCKS = ("two blocks per SM asked of the compiler", "__launch_bounds__(Plan::kThreads)",
              "__launch_bounds__(Plan::kThreads, 2)")
# The split-K reduction launched in plain stream order, not as the multiply's
# programmatic dependent: what the early start is worth.
REDUCTION_IN_ORDER = ("the reduction launched in stream order", "config.numAttrs = facts.dependent_launch ? 1 : 0;",
                      "config.numAttrs = 0;")
# What the reduction costs: the multiply alone, its partial sums never added. Wrong on
# purpose; the split table times it without checking it, and the main table skips it.
NO_REDUCTION = ("no reduction (timing only)", "    if (splits == 1 || status != cudaSuccess) return status;",
                "    return status;")

# name: (BlockM, BlockN, WarpM, WarpN, BlockK, Stages) as fast/kernel.cu's TilePlan takes
# them, and source edits.
VARIANTS = {
    "SquarePlan 128x128, 3 x 32": ((128, 128, 64, 64, 32, 3), []),
    "square, B preloaded": ((128, 128, 64, 64, 32, 3), [PRELOAD_B]),
    "square, 2 x 64": ((128, 128, 64, 64, 64, 2), []),
    "square, 16-row groups": ((128, 128, 64, 64, 32, 3), [GROUPS_16]),
    "square, 3 blocks/SM": ((128, 128, 64, 64, 32, 3), [THREE_BLOCKS]),
    "square, 3 blocks/SM, 4 x 32": ((128, 128, 64, 64, 32, 4), [THREE_BLOCKS]),
    "square, 3 blocks/SM, 2 x 32": ((128, 128, 64, 64, 32, 2), [THREE_BLOCKS]),
    "256x128, 3 x 32": ((256, 128, 64, 64, 32, 3), []),
    "256x128, 2 x 64": ((256, 128, 64, 64, 64, 2), []),
    "256x128, 2 x 64, B preloaded": ((256, 128, 64, 64, 64, 2), [PRELOAD_B]),
    "256x128, 16 warps 64x32, 3 x 32": ((256, 128, 64, 32, 32, 3), []),
    "256x128, 16 warps 64x32, 2 x 64": ((256, 128, 64, 32, 64, 2), []),
    "TuringPlan 128x128, 2 x 16": ((128, 128, 64, 64, 16, 2), []),
    "SquarePlan, 1 block/SM (a T4's)": ((128, 128, 64, 64, 32, 3), [ONE_BLOCK]),
    "SquarePlan, no last stage (must fail)": ((128, 128, 64, 64, 32, 3), [LAST_STAGE_DROPPED]),
    # Eight warps of 32 x 64 in a 128 x 128 tile: half the accumulators per warp (64
    # registers fewer), so more warps per SM, at the price of more fragment loads per MMA.
    "square, 8 warps 32x64, 3 x 32": ((128, 128, 32, 64, 32, 3), []),
    "square, 8 warps 32x64, 4 x 32": ((128, 128, 32, 64, 32, 4), []),
    "square, 8 warps 32x64, 3 x 32, 2 blocks": ((128, 128, 32, 64, 32, 3), [TWO_BLOCKS]),
    # For small grids: 64 x 64 blocks (SmallGridPlan) and one 128 x 64 one.
    "SmallGridPlan 64x64, 32x32 warps, 3 x 32": ((64, 64, 32, 32, 32, 3), []),
    "small, 4 x 32": ((64, 64, 32, 32, 32, 4), []),
    "small, 2 x 64": ((64, 64, 32, 32, 64, 2), []),
    "small, 4 x 64": ((64, 64, 32, 32, 64, 4), []),
    "small, 3 x 32, reduction in stream order": ((64, 64, 32, 32, 32, 3), [REDUCTION_IN_ORDER]),
    "small, 3 x 32, no reduction (timing only)": ((64, 64, 32, 32, 32, 3), [NO_REDUCTION]),
    "128x64, 4 warps 64x32, 3 x 32": ((128, 64, 64, 32, 32, 3), []),
}
SPLIT_SHAPES = [(256, 512, 384), (512, 1024, 128), (1024, 1024, 1024), (2048, 2048, 512), (256, 512, 4096)]
SPLIT_COUNTS = [1, 2, 3, 4, 6, 8, 12, 16]
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (8192, 4096, 1024)]
CHECK_SHAPE = (2304, 1280, 1040)  # M and N multiples of 256, K % 32 == 16: a tail stage

# Every variant's plan launcher behind one function. It fills the variant's
# GemmOperands member by member, so that the bias stays unset (nullptr: no bias), and
# splits K as it is told (workspace: splits x M x N floats).
DISPATCH = """
cudaError_t run_variant(int index, const half* pa, const half* pb, float* c, int m, int n, int k,
                        int splits, float* workspace, cudaStream_t stream) {
    switch (index) {
%s
    }
    return cudaErrorInvalidValue;
}
"""

CASE = """    case {index}: {{
        variant{index}::GemmOperands operands{{}};
        operands.a = pa;
        operands.b = pb;
        operands.c = c;
        operands.m = m;
        operands.n = n;
        operands.k = k;
        return variant{index}::launchPlan<variant{index}::TilePlan<{plan}>>(operands, splits, workspace, stream);
    }}"""

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
        reinterpret_cast<const half*>(b.data_ptr<at::Half>()), c.data_ptr<float>(), a.size(0), b.size(1),
        a.size(1), static_cast<int>(splits), workspace.data_ptr<float>(), c10::cuda::getCurrentCUDAStream());
    TORCH_CHECK(status == cudaSuccess, "variant ", index, ": ", cudaGetErrorString(status));
}
"""

# fast/kernel.cu is cut here: the plans, the kernels and launchPlan come before it; the
# launcher's choice, launchFastGemm and the backward's helpers after it.
CUT_BEFORE = "// Which plan and how many splits of K a call runs"
# What fast/kernel.cu wraps its own code in: a variant's namespace takes its place, and
# the closer, after the cut, is not in the variant's text.
OPENER = "namespace tuned {\n"
INCLUDE = re.compile(r'^#include\s+([<"])([^>"]+)[>"].*\n', re.MULTILINE)


def variant_source(index, edits, fast=FAST):
    """fast/kernel.cu up to its plan launcher, without its includes and its namespace
    opener, with the edits made, in a namespace of its own."""
    with open(os.path.join(fast, "kernel.cu")) as kernel:
        text = kernel.read()
    for needed, what in ((CUT_BEFORE, "the line"), (OPENER.strip(), "the opener")):
        if needed not in text:
            raise SystemExit(f"forward_variants: fast/kernel.cu no longer has {what} {needed!r} to cut at")
    text = INCLUDE.sub("", text[:text.index(CUT_BEFORE)]).replace(OPENER, "", 1)
    for what, old, new in edits:
        if old not in text:
            raise SystemExit(f"forward_variants: fast/kernel.cu no longer has the text that '{what}' edits")
        text = text.replace(old, new)
    return f"namespace variant{index} {{\n{text}\n}}\n"


def variants_source(variants, fast=FAST):
    """Plain CUDA (no torch): the includes of fast/kernel.cu once, outside every
    namespace, then every variant's namespace and run_variant(). The lesson's kernel.cu
    comes as its text, not as an include: the build, keyed by its sources' text, is
    then rebuilt when the lesson's kernel changes."""
    with open(os.path.join(fast, "kernel.cu")) as kernel:
        includes = INCLUDE.findall(kernel.read())
    parts = []
    for kind, name in includes:
        if kind == "<":
            parts.append(f"#include <{name}>\n")
        else:  # a file of the project, at its path from fast/
            with open(os.path.join(fast, name)) as included:
                parts.append(f"// {name}\n{included.read()}\n")
    namespaces = "".join(variant_source(index, edits, fast) for index, (_, edits) in enumerate(variants.values()))
    cases = "\n".join(CASE.format(index=index, plan=", ".join(map(str, plan)))
                      for index, (plan, _) in enumerate(variants.values()))
    return "".join(parts) + namespaces + DISPATCH % cases


def build(variants):
    # Imported here, where a GPU is: its import warns "No CUDA runtime is found" wherever none is.
    from torch.utils import cpp_extension
    return cpp_extension.load_inline(
        "day87_forward_variants",
        cpp_sources="void run_plan(int64_t, torch::Tensor, torch::Tensor, torch::Tensor, int64_t, torch::Tensor);",
        cuda_sources=BINDING % variants_source(variants), functions=["run_plan"],
        extra_cuda_cflags=["-O3"], verbose=False)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("names", nargs="*", help="only the variants whose names hold one of these")
    parser.add_argument("--splits", action="store_true", help="the split-K table instead of the main one")
    arguments = parser.parse_args()
    if not torch.cuda.is_available():  # said before anything builds
        print("forward_variants.py needs a GPU; nothing to measure here.")
        return
    sys.path.insert(0, LESSON)
    sys.path.insert(0, FAST)
    import bench  # cuBLAS at the same precision contract (and, through it, the fast tier's build)
    import timing  # how a call is timed, and the input sets rotated past the L2
    import test_op  # the error bound: error_ratio

    wanted = arguments.names
    if arguments.splits and not wanted:
        wanted = ["SquarePlan 128x128", "SmallGridPlan", "TuringPlan"]
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
    header = f"{'variant':<34}{'error at ' + 'x'.join(map(str, CHECK_SHAPE)):>22}"
    print(header + "".join(f"{'x'.join(map(str, shape)):>22}" for shape in SHAPES))
    rows = [("cuBLAS", None, base)] + [(name, index, plan_call(index)) for index, name in enumerate(variants)
                                       if "timing only" not in name]  # those are for the split table
    baseline_ms = {}
    unexpected = 0  # a variant that fails the check, or a "must fail" one that passes it
    for name, index, call in rows:
        line = f"{name:<34}"
        if index is None:
            line += f"{'':>22}"
        else:
            ratio = test_op.error_ratio(call(a, b), a, b)
            line += f"{100 * ratio:>20.1f}% " if ratio <= 1 else f"{'FAIL ' + format(ratio, '.3g'):>22}"
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
    import fast_op
    cublas = bench.baseline()
    base, base_name = cublas.function, cublas.label
    print(f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}; microseconds per call, "
          f"graph replays, operands in L2; fast_op.wmma_mm is the launcher's own choice")
    one = torch.zeros(1, device="cuda")
    print(f"the floor, a kernel that does next to nothing (a one-element add_): "
          f"{timing.graph_microseconds(lambda: one.add_(1)):.2f}")
    for index, name in enumerate(variants):
        print(f"\n{name}")
        print(f"{'M x N x K':<18}{base_name:>24}{'fast_op.wmma_mm':>17}" + "".join(f"{s:>8}" for s in SPLIT_COUNTS))
        for m, n, k in SPLIT_SHAPES:
            a = torch.randn(m, k, device="cuda", dtype=torch.half)
            b = torch.randn(k, n, device="cuda", dtype=torch.half)
            line = (f"{f'{m}x{n}x{k}':<18}{timing.graph_microseconds(lambda: base(a, b)):>24.2f}"
                    f"{timing.graph_microseconds(lambda: fast_op.wmma_mm(a, b)):>17.2f}")
            for splits in SPLIT_COUNTS:
                call = plan_call(index, splits)
                if "timing only" not in name and test_op.error_ratio(call(a, b), a, b) > 1:
                    line += f"{'FAIL':>8}"
                    continue
                line += f"{timing.graph_microseconds(lambda: call(a, b)):>8.2f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
