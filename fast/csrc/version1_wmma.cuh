// fast/csrc/version1_wmma.cuh: version 1 of the fast forward, wmmaGemmKernel, for any card
// from sm_75 up.
//
// The lesson's kernel.cu tuned: the same WMMA fragments and FP32 accumulators under
// three tile plans (launch_policy.cu chooses one per call), K split across blocks
// where the grid of tiles is too small for the card (the partial sums added by a
// second, deterministic kernel, launched early as the multiply's programmatic
// dependent on sm_90), a bias added in the one store. Every figure behind a choice is
// in fast/NOTES.md ("Version 1: tile plans and split K").
//
// In order: the 16-byte copies (the lesson's, copied), the tile plans, the
// dependent-launch helpers, a stage's copy, the one place that writes C, the tile a
// block owns (groupedTile) and the loop over K's stages (multiplyStages), the kernel,
// the split-K reduction, and launchPlan, which launches one plan.

#pragma once

#include <mma.h>

#include "common.cuh"

namespace tuned {
namespace version1 {

namespace wmma = nvcuda::wmma;

// ---- 16-byte copies from global to shared memory --------------------------
// sm_80 and newer: cp.async copies without passing through registers, so the
// loads for later stages are in flight while the warps compute. On sm_75 (a T4)
// cp.async does not exist, and the same calls become a synchronous 16-byte load
// and store and two no-ops: still correct, with no overlap of copy and compute.
__device__ __forceinline__ void copy16Async(half* shared_destination, const half* global_source,
                                            bool in_bounds) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    const unsigned destination =
        static_cast<unsigned>(__cvta_generic_to_shared(shared_destination));
    // src-size 0 reads nothing and writes 16 zero bytes: the K tail.
    const int source_bytes = in_bounds ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(destination),
                 "l"(global_source), "r"(source_bytes));
#else
    *reinterpret_cast<uint4*>(shared_destination) =
        in_bounds ? *reinterpret_cast<const uint4*>(global_source) : make_uint4(0, 0, 0, 0);
#endif
}

__device__ __forceinline__ void commitCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::);
#endif
}

// Wait until at most `pending` committed groups are still in flight.
template <int pending>
__device__ __forceinline__ void waitForCopies() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(pending));
#endif
}

// Shared-memory rows are padded by 8 halves (16 bytes), as the lesson's are (its
// kPad, copied): an unpadded 64-byte A row puts the eight 16-byte rows that one
// fragment load reads at once on the same four banks; 80-byte rows land on all 32. The
// pad keeps every fragment 32-byte aligned, which WMMA requires.
constexpr int kPad = 8;

// ---------------------------------------------------------------------------
// The tile plans
// ---------------------------------------------------------------------------
// The lesson's pad (kPad) keeps every plan's rows off each other's banks: 48-byte
// rows for 16-wide stages and 272-byte B rows land on all 32 banks too. WMMA takes a
// pointer and a row stride, so a swizzled layout, the other cure, cannot be
// expressed through it.

// A plan: the block tile (BlockM x BlockN of C), the part of it each warp owns
// (WarpM x WarpN), how much of K one pipeline stage holds (BlockK), and how many
// stages are in shared memory at once.
template <int BlockM, int BlockN, int WarpM, int WarpN, int BlockK, int Stages>
struct TilePlan {
    static constexpr int kBlockM = BlockM, kBlockN = BlockN, kBlockK = BlockK;
    static constexpr int kWarpM = WarpM, kWarpN = WarpN;
    static constexpr int kFragmentsM = WarpM / kWmmaSize;  // WMMA fragments per warp, down
    static constexpr int kFragmentsN = WarpN / kWmmaSize;  // and across
    static constexpr int kStages = Stages;
    static constexpr int kWarpsM = BlockM / WarpM;
    static constexpr int kWarpsN = BlockN / WarpN;
    static constexpr int kThreads = 32 * kWarpsM * kWarpsN;
    static constexpr int kStrideA = BlockK + kPad;  // halves per A row in shared memory
    static constexpr int kStrideB = BlockN + kPad;  // halves per B row
    static constexpr int kStageHalvesA = BlockM * kStrideA;
    static constexpr int kStageHalvesB = BlockK * kStrideB;
    static constexpr int kSharedBytes = Stages * (kStageHalvesA + kStageHalvesB) * 2;
    // The epilogue reuses the pipeline's shared memory: each warp stages one 16-row
    // strip of its FP32 result (rows padded by 4 floats) before writing it out.
    static constexpr int kStrideC = WarpN + 4;
    static constexpr int kEpilogueFloatsPerWarp = kWmmaSize * kStrideC;

    static_assert(BlockM % WarpM == 0 && BlockN % WarpN == 0, "whole warp tiles");
    static_assert(WarpM % kWmmaSize == 0 && WarpN % kWmmaSize == 0, "whole fragments");
    static_assert(BlockK % kWmmaSize == 0, "whole WMMA steps per stage");
    static_assert(Stages >= 2, "the loop below copies one stage while it computes another");
    static_assert((BlockM * BlockK / 8) % kThreads == 0 && (BlockK * BlockN / 8) % kThreads == 0,
                  "every thread copies the same number of 16-byte pieces");
    static_assert(kWarpsM * kWarpsN * kEpilogueFloatsPerWarp * 4 <= kSharedBytes,
                  "the epilogue's staging must fit in the pipeline's shared memory");
};

// The three plans the launcher chooses from (launch_policy.cu's chooseLaunch).
//
// Every warp of Square and Turing owns 64 x 64 of C: 4 x 4 WMMA fragments, so every
// A fragment loaded from shared memory feeds 4 MMAs and so does every B fragment. In
// a 64 x 32 warp tile each A fragment feeds only 2, and eight such warps measured
// slower than four 64 x 64 ones (fast/NOTES.md has every variant, its figure and
// what limits it).
//
// Square: 128 x 128, four warps, three stages of 32 of K: while the warps multiply
// one stage, the copies for the next two are in flight. 55.5 KB: two blocks (eight
// warps) per SM where an SM gives blocks 111 KB or more (an A100, an H100 or H200).
// Measured no faster (fast/NOTES.md): 64-deep stages (more registers, the same two
// blocks per SM); four or five stages; a 256 x 128 tile (a quarter less L2 traffic
// per flop, but one block of eight warps per SM, which all wait at the same barrier
// with no second block to fill the gaps).
using SquarePlan = TilePlan<128, 128, 64, 64, 32, 3>;
// Turing: code compiled below sm_80 (a T4, sm_75) has no cp.async, so a stage is
// copied synchronously and the copy latency is hidden by another block's MMAs, not
// by stages in flight. A T4 SM has 64 KB of shared memory: two stages of 16 take
// 20.5 KB, so shared memory allows three blocks, where Square's 55.5 KB allows one;
// 128 threads of at most 255 registers allow two (2 x 128 x 256 = 65536, the
// register file). So two blocks per SM, by arithmetic; the registers are in NOTES.md.
using TuringPlan = TilePlan<128, 128, 64, 64, 16, 2>;
// SmallGrid: for outputs of fewer 128 x 128 tiles than the card has SMs, 64 x 64 tiles
// of four 32 x 32 warps: four times the blocks, each with a quarter of the MMAs to
// issue one after another, where the call waits on one block's walk along K, not on
// the card's throughput. Each fragment then feeds only 2 MMAs, which large outputs
// pay for (fast/NOTES.md: the split table).
using SmallGridPlan = TilePlan<64, 64, 32, 32, 32, 3>;
// Every shape the contract admits must be whole tiles of every plan.
template <class Plan>
constexpr bool tilesTheContract() {
    return kTileM % Plan::kBlockM == 0 && kTileN % Plan::kBlockN == 0;
}
static_assert(tilesTheContract<SquarePlan>() && tilesTheContract<TuringPlan>() &&
                  tilesTheContract<SmallGridPlan>(),
              "a plan's block tile must divide the contract's 128 x 128");

// Programmatic dependent launch, sm_90 and newer: a kernel launched as the dependent
// of the one before it on the stream (launchPlan says when) may start once every
// block of that one has called letDependentsStart, and waitForPrerequisites then
// holds it until that kernel has finished and its writes are visible. Below sm_90
// both compile to nothing, and launchPlan launches in plain stream order instead.
__device__ __forceinline__ void letDependentsStart() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ void waitForPrerequisites() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Whether a dependent waits is not left to timing: the gate's ordering build
// (fast/proof/gate_check.cuh) defines this to hold every split a while before it writes
// its partial sums, so that a reduction reading them before its wait reads the
// workspace's poison on every shape. Everywhere else it is nothing.
#ifndef DAY87_HOLD_PARTIAL_SUMS
#define DAY87_HOLD_PARTIAL_SUMS()
#endif

// Copy one stage: the BlockM x BlockK slice of A and the BlockK x BlockN slice of B
// that start at k_start. Consecutive threads take consecutive 16-byte pieces of a
// row, so every warp reads whole runs of a row. A stage that sticks out past K (the
// contract only asks K % 16 == 0) is filled with zeros.
template <class Plan>
__device__ __forceinline__ void loadStage(half* shared_a, half* shared_b, const half* a,
                                          const half* b, int k, int n, int tile_row,
                                          int tile_col, int k_start) {
    constexpr int kPiecesPerRowA = Plan::kBlockK / 8;
    constexpr int kPiecesPerRowB = Plan::kBlockN / 8;
#pragma unroll
    for (int i = 0; i < Plan::kBlockM * kPiecesPerRowA / Plan::kThreads; ++i) {
        const int piece = threadIdx.x + i * Plan::kThreads;
        const int row = piece / kPiecesPerRowA;
        const int col = (piece % kPiecesPerRowA) * 8;
        const bool in_bounds = k_start + col < k;
        const half* source = a + (static_cast<size_t>(tile_row) * Plan::kBlockM + row) * k +
                             (in_bounds ? k_start + col : 0);
        copy16Async(shared_a + row * Plan::kStrideA + col, source, in_bounds);
    }
#pragma unroll
    for (int i = 0; i < Plan::kBlockK * kPiecesPerRowB / Plan::kThreads; ++i) {
        const int piece = threadIdx.x + i * Plan::kThreads;
        const int row = piece / kPiecesPerRowB;
        const int col = (piece % kPiecesPerRowB) * 8;
        const bool in_bounds = k_start + row < k;
        const half* source = b + static_cast<size_t>(in_bounds ? k_start + row : 0) * n +
                             tile_col * Plan::kBlockN + col;
        copy16Async(shared_b + row * Plan::kStrideB + col, source, in_bounds);
    }
}

// The epilogue's store: four consecutive outputs of one row, each written once,
// whether the kernel stores its own sums or the split-K reduction stores the splits'.
// The bias is added here, once per output, whichever of the two stores.
__device__ __forceinline__ void storeOutputs(const FastGemmOperands& operands, size_t row, int col,
                                             float4 value) {
    if (operands.bias)  // bias[j] is added to every row of column j, once
        value = make_float4(value.x + operands.bias[col], value.y + operands.bias[col + 1],
                            value.z + operands.bias[col + 2], value.w + operands.bias[col + 3]);
    *reinterpret_cast<float4*>(operands.c + row * operands.n + col) = value;
}

// ---------------------------------------------------------------------------
// Version 1, the WMMA kernel: any card from sm_75 up
// ---------------------------------------------------------------------------
// Its parts: which tile a block owns, the accumulators, the multiply's pipeline over a
// run of stages, and the kernel that calls them and stores C.

// Which tile of C this block owns, in grouped order (see kGroupRows), from its index
// along the grid's x.
template <class Plan>
__device__ __forceinline__ void groupedTile(int m, int n, int* tile_row, int* tile_col) {
    const int tiles_m = m / Plan::kBlockM;
    const int tiles_n = n / Plan::kBlockN;
    const int tiles_per_group = kGroupRows * tiles_n;
    const int group = blockIdx.x / tiles_per_group;
    const int first_row = group * kGroupRows;
    const int rows_in_group = min(tiles_m - first_row, kGroupRows);
    const int index_in_group = blockIdx.x % tiles_per_group;
    *tile_row = first_row + index_in_group % rows_in_group;
    *tile_col = index_in_group / rows_in_group;
}

using Accumulator = wmma::fragment<wmma::accumulator, kWmmaSize, kWmmaSize, kWmmaSize, float>;

// The multiply: stages [first_k_tile, first_k_tile + k_tiles) of the tile's A rows and
// B columns, added into this warp's accumulators. Every copy it starts has landed
// when it returns, but other warps may still read the last stage.
template <class Plan>
__device__ __forceinline__ void multiplyStages(
    Accumulator (&accumulators)[Plan::kFragmentsM][Plan::kFragmentsN], const half* __restrict__ a,
    const half* __restrict__ b, int k, int n, half* shared_a, half* shared_b, int tile_row,
    int tile_col, int first_k_tile, int k_tiles) {
    const int warp = threadIdx.x / 32;
    const int warp_row = warp / Plan::kWarpsN;
    const int warp_col = warp % Plan::kWarpsN;

    // Prologue: start the copies of the first kStages - 1 stages. A group is
    // committed even when empty, so that the wait counts below stay exact.
#pragma unroll
    for (int stage = 0; stage < Plan::kStages - 1; ++stage) {
        if (stage < k_tiles)
            loadStage<Plan>(shared_a + stage * Plan::kStageHalvesA,
                            shared_b + stage * Plan::kStageHalvesB, a, b, k, n, tile_row,
                            tile_col, (first_k_tile + stage) * Plan::kBlockK);
        commitCopies();
    }

    for (int k_tile = 0; k_tile < k_tiles; ++k_tile) {
        // Stage k_tile has landed once at most kStages - 2 newer groups are pending;
        // the barrier makes every thread's copies visible to every warp, and also
        // proves all warps are done with the stage that the next copy overwrites.
        waitForCopies<Plan::kStages - 2>();
        __syncthreads();

        const int next = k_tile + Plan::kStages - 1;
        if (next < k_tiles) {
            const int next_stage = next % Plan::kStages;
            loadStage<Plan>(shared_a + next_stage * Plan::kStageHalvesA,
                            shared_b + next_stage * Plan::kStageHalvesB, a, b, k, n, tile_row,
                            tile_col, (first_k_tile + next) * Plan::kBlockK);
        }
        commitCopies();

        const int stage = k_tile % Plan::kStages;
        const half* stage_a =
            shared_a + stage * Plan::kStageHalvesA + warp_row * Plan::kWarpM * Plan::kStrideA;
        const half* stage_b = shared_b + stage * Plan::kStageHalvesB + warp_col * Plan::kWarpN;
#pragma unroll
        for (int k_step = 0; k_step < Plan::kBlockK; k_step += kWmmaSize) {
            wmma::fragment<wmma::matrix_a, kWmmaSize, kWmmaSize, kWmmaSize, half, wmma::row_major>
                a_fragments[Plan::kFragmentsM];
#pragma unroll
            for (int i = 0; i < Plan::kFragmentsM; ++i)
                wmma::load_matrix_sync(a_fragments[i],
                                       stage_a + i * kWmmaSize * Plan::kStrideA + k_step,
                                       Plan::kStrideA);
            // One B fragment at a time, each feeding four MMAs: loading all four
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
            }
        }
    }
    waitForCopies<0>();
}

// What the kernel adds over the lesson's: the tile plans above, split K, the bias in
// its store (fast/NOTES.md, "Version 1: tile plans and split K").
// With gridDim.y > 1 the block computes one split of K, k_tiles_per_split stages
// from stage blockIdx.y * k_tiles_per_split, and writes its raw sums to
// `partials` (one M x N slice per split) for splitSumKernel; otherwise all of K,
// into C. (The launchers say when K is split.)
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads)
    wmmaGemmKernel(const FastGemmOperands operands, float* __restrict__ partials,
                   int k_tiles_per_split) {
    const int m = operands.m, n = operands.n, k = operands.k;
    extern __shared__ __align__(128) unsigned char shared_bytes[];
    half* shared_a = reinterpret_cast<half*>(shared_bytes);
    half* shared_b = shared_a + Plan::kStages * Plan::kStageHalvesA;
    int tile_row, tile_col;
    groupedTile<Plan>(m, n, &tile_row, &tile_col);

    Accumulator accumulators[Plan::kFragmentsM][Plan::kFragmentsN];
#pragma unroll
    for (int i = 0; i < Plan::kFragmentsM; ++i)
#pragma unroll
        for (int j = 0; j < Plan::kFragmentsN; ++j) wmma::fill_fragment(accumulators[i][j], 0.0f);

    // The kernel launched as this one's dependent (the split-K reduction) may now be
    // scheduled onto the SMs that this grid leaves idle; it still waits for our sums.
    letDependentsStart();

    // This block's stages of K: [first_k_tile, first_k_tile + k_tiles).
    const int first_k_tile = blockIdx.y * k_tiles_per_split;
    const int k_tiles =
        min(k_tiles_per_split, (k + Plan::kBlockK - 1) / Plan::kBlockK - first_k_tile);
    multiplyStages<Plan>(accumulators, operands.a, operands.b, k, n, shared_a, shared_b, tile_row,
                         tile_col, first_k_tile, k_tiles);

    // Epilogue. Storing fragments straight to C writes 64-byte pieces of 16 rows;
    // staging each 16 x 64 strip in shared memory lets a warp write two whole
    // 256-byte rows per instruction with 16-byte stores instead.
    __syncthreads();  // every warp is done reading the pipeline's shared memory
    if (partials != nullptr) DAY87_HOLD_PARTIAL_SUMS();
    const int warp = threadIdx.x / 32;
    const int warp_row = warp / Plan::kWarpsN;
    const int warp_col = warp % Plan::kWarpsN;
    float* staging = reinterpret_cast<float*>(shared_bytes) + warp * Plan::kEpilogueFloatsPerWarp;
    const int lane = threadIdx.x % 32;
    const size_t first_c_row =
        static_cast<size_t>(tile_row) * Plan::kBlockM + warp_row * Plan::kWarpM;
    const int first_c_col = tile_col * Plan::kBlockN + warp_col * Plan::kWarpN;
#pragma unroll
    for (int i = 0; i < Plan::kFragmentsM; ++i) {
#pragma unroll
        for (int j = 0; j < Plan::kFragmentsN; ++j)
            wmma::store_matrix_sync(staging + j * kWmmaSize, accumulators[i][j], Plan::kStrideC,
                                    wmma::mem_row_major);
        __syncwarp();
        constexpr int kVectorsPerRow = Plan::kWarpN / 4;  // float4s per row of the strip
#pragma unroll
        for (int vector = lane; vector < kWmmaSize * kVectorsPerRow; vector += 32) {
            const int row = vector / kVectorsPerRow;
            const int col = (vector % kVectorsPerRow) * 4;
            const float4 value =
                *reinterpret_cast<const float4*>(staging + row * Plan::kStrideC + col);
            const size_t c_row = first_c_row + i * kWmmaSize + row;
            if (partials == nullptr)
                storeOutputs(operands, c_row, first_c_col + col, value);
            else  // one split's sums, in its own slice; splitSumKernel stores the total
                *reinterpret_cast<float4*>(partials +
                                           (blockIdx.y * static_cast<size_t>(m) + c_row) * n +
                                           first_c_col + col) = value;
        }
        __syncwarp();  // the strip is read out before the next one overwrites it
    }
}

// The split-K reduction: C = the splits' partial sums added in split order, so the
// same inputs give the same bits on every run (floating-point atomics would not),
// then stored through the one epilogue. `partials` is not __restrict__ on purpose:
// restrict promises that nothing else writes that memory while the kernel runs, which
// lets the compiler move its loads across the wait (and read them through the
// read-only cache), and here the multiply writes it until the wait returns.
constexpr int kMaxSplits = 16;  // the launcher splits K at most this many ways

__global__ void __launch_bounds__(256)
    splitSumKernel(const FastGemmOperands operands, const float* partials, int splits) {
    waitForPrerequisites();  // the multiply's partial sums are all written
    const size_t outputs = static_cast<size_t>(operands.m) * operands.n;
    for (size_t i = 4 * (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x); i < outputs;
         i += 4 * static_cast<size_t>(gridDim.x) * blockDim.x) {
        float4 sum = *reinterpret_cast<const float4*>(partials + i);
        for (int split = 1; split < splits; ++split) {
            const float4 part = *reinterpret_cast<const float4*>(partials + split * outputs + i);
            sum = make_float4(sum.x + part.x, sum.y + part.y, sum.z + part.z, sum.w + part.w);
        }
        storeOutputs(operands, i / operands.n, static_cast<int>(i % operands.n), sum);
    }
}

// One plan on `stream`, with K in `splits` runs of whole stages (1: no split).
// `workspace` holds splits x M x N floats where splits > 1. The caller has checked
// that the plan's block tile divides M and N and that the sizes fit an int.
// `dependent_launch`: whether the device runs code for sm_90 or newer, built with CUDA 12
// or newer (launch_policy.cu's DeviceFacts), whose reduction waits for its prerequisite.
template <class Plan>
cudaError_t launchPlan(const FastGemmOperands& operands, int splits, float* workspace,
                       bool dependent_launch, cudaStream_t stream) {
    // Above 48 KB of dynamic shared memory a kernel must opt in, per device. The
    // call costs well under a microsecond and is not a stream operation, so it is
    // also allowed while a CUDA graph is being captured.
    cudaError_t status = cudaFuncSetAttribute(
        wmmaGemmKernel<Plan>, cudaFuncAttributeMaxDynamicSharedMemorySize, Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;
    const int per_split = (k_tiles + splits - 1) / splits;
    splits = per_split ? (k_tiles + per_split - 1) / per_split : 1;  // no empty split
    const dim3 blocks((operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN), splits);
    wmmaGemmKernel<Plan><<<blocks, Plan::kThreads, Plan::kSharedBytes, stream>>>(
        operands, splits > 1 ? workspace : nullptr, splits > 1 ? per_split : k_tiles);
    status = cudaGetLastError();
    if (splits == 1 || status != cudaSuccess) return status;

    const size_t vectors = static_cast<size_t>(operands.m) * operands.n / 4;
    const unsigned reduction_blocks =
        static_cast<unsigned>(std::min<size_t>((vectors + 255) / 256, 4096));
#if CUDART_VERSION >= 12000
    // The reduction as the multiply's dependent where the code has the wait for it
    // (sm_90 and up): its launch then overlaps the multiply instead of following it,
    // which measured faster (fast/NOTES.md). Older code has no wait, so there it is
    // launched in plain stream order. A CUDA graph captures either kind.
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(reduction_blocks);
    config.blockDim = dim3(256);
    config.stream = stream;
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &dependent;
    config.numAttrs = dependent_launch ? 1 : 0;
    return cudaLaunchKernelEx(&config, splitSumKernel, operands,
                              static_cast<const float*>(workspace), splits);
#else  // CUDA 11's runtime has no programmatic dependent launch
    splitSumKernel<<<reduction_blocks, 256, 0, stream>>>(operands, workspace, splits);
    return cudaGetLastError();
#endif
}

}  // namespace version1
}  // namespace tuned
