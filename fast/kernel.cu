// fast/kernel.cu: the fast operator's kernels, day87_fast::wmma_mm and wmma_mm_bias's
// forward and the tensor-core backward's scaling kernel.
//
// Three versions of the forward stand side by side, the simplest first:
//   1. wmmaGemmKernel, the lesson's kernel.cu tuned: the same WMMA fragments and FP32
//      accumulators under three tile plans (one chosen per call), K split across
//      blocks where the grid of tiles is too small for the card (the partial sums
//      added by a second, deterministic kernel, launched early as the multiply's
//      programmatic dependent on sm_90), a bias added in the one store. Any card.
//   2. hopperGemmKernel, for Hopper (sm_90a code): TMA copies into swizzled shared
//      memory, mbarriers, and warpgroup MMAs (wgmma), at about twice version 1's speed
//      on large grids there. Its section says what it adds.
//   3. hopperPersistentKernel: version 2's pipeline (the same parts) in a persistent
//      grid, the ring running on from one tile into the next, and registers moved
//      from the producer to the consumers (setmaxnreg). The launchers choose it where
//      they chose version 2.
// Then the backward's cooperative scaling kernel. Every figure behind a choice is in
// checks/NOTES.md.
//
// The lesson's kernel.cu is included first, outside this file's namespace: the shape
// contract (kTileM, kTileN, kTileK, which fast/binding.cpp's rules read), the 16-byte
// copies, the pad and the block groups' size (kGroupRows) come from there, written
// once. Its own kernel and launcher are compiled here too and never called: a few
// seconds of build, the price of one file holding those numbers. This folder's
// launcher is launchFastGemm, a name of its own: a search for the lesson's launcher
// finds the lesson's alone.
//
// Built two ways:
//   - by fast/fast_op.py, through cpp_extension.load with op.py's build helpers, with
//     fast/binding.cpp (and the sm_90a target where a Hopper card may run the build);
//   - included by fast/gate.cu, the standalone check:
//       nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o fast/gate fast/gate.cu && fast/gate
//
// In order: the tile plans, the dependent-launch helpers, GemmOperands and
// storeOutputs (version 1's one place that writes C, with the bias), version 1, the
// split-K reduction, the Hopper pipeline's parts, versions 2 and 3, the launchers
// (which choose between them), and last the backward's scaling kernel.
//
// This file never exits and never waits for the caller's work: the launchers return
// the launch status, and the caller (an operator that raises, or fast/gate.cu's
// CUDA_CHECK) decides what an error means. The one wait is runsHopperCode's, once per
// device and thread, for a one-thread probe on a stream of its own.

#include "../kernel.cu"

#include <cooperative_groups.h>
#include <cuda.h>          // CUtensorMap and its enums: types only, no driver library is linked
#include <cudaTypedefs.h>  // the type of cuTensorMapEncodeTiled, which the runtime hands over

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tuned {

namespace cooperative = cooperative_groups;

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

// The three plans the launcher chooses from (chooseLaunch, at the end).
//
// Every warp of Square and Turing owns 64 x 64 of C: 4 x 4 WMMA fragments, so every
// A fragment loaded from shared memory feeds 4 MMAs and so does every B fragment. In
// a 64 x 32 warp tile each A fragment feeds only 2, and eight such warps measured
// slower than four 64 x 64 ones (checks/NOTES.md has every variant, its figure and
// what limits it).
//
// Square: 128 x 128, four warps, three stages of 32 of K: while the warps multiply
// one stage, the copies for the next two are in flight. 55.5 KB: two blocks (eight
// warps) per SM where an SM gives blocks 111 KB or more (an A100, an H100 or H200).
// Measured no faster (checks/NOTES.md): 64-deep stages (more registers, the same two
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
// pay for (checks/NOTES.md: the split table).
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

// Whether a dependent waits is not left to timing: gate.cu's ordering build defines
// this to hold every split a while before it writes its partial sums, so that a
// reduction reading them before its wait reads the workspace's poison on every shape.
// Everywhere else it is nothing.
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

// ---------------------------------------------------------------------------
// The operands, and the one place that writes C
// ---------------------------------------------------------------------------
// What one multiply reads and writes: the lesson's GemmOperands with the bias. The
// kernels and the plan launchers take it whole. launchFastGemm zero-fills it
// (`operands{}`): wmma_mm passes no bias, so the bias is nullptr there, and the
// store tests it first.
struct GemmOperands {
    const half* a;      // M x K, row-major
    const half* b;      // K x N, row-major
    float* c;           // M x N, row-major
    int m, n, k;
    const float* bias;  // N values, one per column of C, or nullptr for none
};

// The epilogue's store: four consecutive outputs of one row, each written once,
// whether the kernel stores its own sums or the split-K reduction stores the splits'.
// The bias is added here, once per output, whichever of the two stores.
__device__ __forceinline__ void storeOutputs(const GemmOperands& operands, size_t row, int col,
                                             float4 value) {
    if (operands.bias)  // bias[j] is added to every row of column j, once
        value = make_float4(value.x + operands.bias[col], value.y + operands.bias[col + 1],
                            value.z + operands.bias[col + 2], value.w + operands.bias[col + 3]);
    *reinterpret_cast<float4*>(operands.c + row * operands.n + col) = value;
}

// ---------------------------------------------------------------------------
// Version 1, the WMMA kernel: any card from sm_75 up
// ---------------------------------------------------------------------------
// What it adds over the lesson's kernel: the tile plans above, split K, the bias in
// its store (checks/NOTES.md, "The fast forward: tile plans and split K").
// With gridDim.y > 1 the block computes one split of K, k_tiles_per_split stages
// from stage blockIdx.y * k_tiles_per_split, and writes its raw sums to
// `partials` (one M x N slice per split) for splitSumKernel; otherwise all of K,
// into C. (The launchers say when K is split.)
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads)
    wmmaGemmKernel(const GemmOperands operands, float* __restrict__ partials, int k_tiles_per_split) {
    const half* __restrict__ a = operands.a;
    const half* __restrict__ b = operands.b;
    const int m = operands.m, n = operands.n, k = operands.k;
    extern __shared__ __align__(128) unsigned char shared_bytes[];
    half* shared_a = reinterpret_cast<half*>(shared_bytes);
    half* shared_b = shared_a + Plan::kStages * Plan::kStageHalvesA;

    // Which tile of C this block owns, in grouped order (see kGroupRows).
    const int tiles_m = m / Plan::kBlockM;
    const int tiles_n = n / Plan::kBlockN;
    const int tiles_per_group = kGroupRows * tiles_n;
    const int group = blockIdx.x / tiles_per_group;
    const int first_row = group * kGroupRows;
    const int rows_in_group = min(tiles_m - first_row, kGroupRows);
    const int index_in_group = blockIdx.x % tiles_per_group;
    const int tile_row = first_row + index_in_group % rows_in_group;
    const int tile_col = index_in_group / rows_in_group;

    const int warp = threadIdx.x / 32;
    const int warp_row = warp / Plan::kWarpsN;
    const int warp_col = warp % Plan::kWarpsN;

    wmma::fragment<wmma::accumulator, kWmmaSize, kWmmaSize, kWmmaSize, float>
        accumulators[Plan::kFragmentsM][Plan::kFragmentsN];
#pragma unroll
    for (int i = 0; i < Plan::kFragmentsM; ++i)
#pragma unroll
        for (int j = 0; j < Plan::kFragmentsN; ++j) wmma::fill_fragment(accumulators[i][j], 0.0f);

    // The kernel launched as this one's dependent (the split-K reduction) may now be
    // scheduled onto the SMs that this grid leaves idle; it still waits for our sums.
    letDependentsStart();

    // This block's stages of K: [first_k_tile, first_k_tile + k_tiles).
    const int first_k_tile = blockIdx.y * k_tiles_per_split;
    const int k_tiles = min(k_tiles_per_split, (k + Plan::kBlockK - 1) / Plan::kBlockK - first_k_tile);

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

    // Epilogue. Storing fragments straight to C writes 64-byte pieces of 16 rows;
    // staging each 16 x 64 strip in shared memory lets a warp write two whole
    // 256-byte rows per instruction with 16-byte stores instead.
    waitForCopies<0>();
    __syncthreads();  // every warp is done reading the pipeline's shared memory
    if (partials != nullptr) DAY87_HOLD_PARTIAL_SUMS();
    float* staging = reinterpret_cast<float*>(shared_bytes) + warp * Plan::kEpilogueFloatsPerWarp;
    const int lane = threadIdx.x % 32;
    const size_t first_c_row = static_cast<size_t>(tile_row) * Plan::kBlockM + warp_row * Plan::kWarpM;
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
                *reinterpret_cast<float4*>(partials + (blockIdx.y * static_cast<size_t>(m) + c_row) * n +
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
    splitSumKernel(const GemmOperands operands, const float* partials, int splits) {
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

// ---------------------------------------------------------------------------
// Version 2, the Hopper kernel (sm_90a): what it adds over wmmaGemmKernel
// ---------------------------------------------------------------------------
// wmmaGemmKernel is version 1: every thread copies its share of each stage, and
// every warp multiplies 16 x 16 x 16 fragments (HMMA) that it loads from padded
// shared memory. On Hopper that reaches half of cuBLAS's speed (checks/NOTES.md, "The
// Hopper kernel"): its tensor cores run at full rate only through warpgroup MMA
// (wgmma.mma_async, HGMMA in SASS), four warps multiplying 64 rows at once straight
// from shared memory, which the tensor copy engine (TMA) fills. What changes:
//   - one thread of a producer warpgroup asks TMA for each stage, a whole box of A
//     and of B in one instruction, described by a tensor map built on the host;
//   - TMA writes the stage swizzled (128-byte rows, 16-byte pieces reordered by row),
//     the layout wgmma reads without bank conflicts, which WMMA could not express;
//   - each stage has two mbarriers in place of __syncthreads: `full`, which
//     completes when TMA has written all its bytes, and `empty`, which completes
//     when every consumer warp is done with it, so the producer runs stages ahead;
//   - two consumer warpgroups each multiply 64 rows of the block's 128 with wgmma,
//     accumulating FP32 in registers, and store C (with the bias) from there.
// wgmma exists only in code compiled for sm_90a (-gencode=arch=compute_90a,code=sm_90a):
// fast_op.py adds that target where a Hopper card may run the build, and the kernel's
// body is empty in every other target, where hopperCodeProbe (below) tells the
// launcher not to choose it.
//
// A plan: the block tile (128 x BlockN of C), 64 of K per stage, Stages deep.
#if CUDART_VERSION >= 12000  // tensor maps and __grid_constant__: CUDA 12's headers
template <int BlockN, int Stages>
struct HopperPlan {
    static constexpr int kBlockM = 128, kBlockN = BlockN, kBlockK = 64, kStages = Stages;
    // Warpgroup 0 produces, warpgroups 1 and 2 consume: each owns 64 rows of C.
    static constexpr int kThreads = 3 * 128;
    static constexpr int kConsumerWarps = 8;
    // 64 halves are 128 bytes: one row of the 128-byte swizzle, the widest box TMA
    // swizzles. A is one box of 128 rows; B is BlockN / 64 boxes of 64 rows, side by side.
    static constexpr int kBoxColumns = 64;
    static constexpr int kStageBytesA = kBlockM * kBlockK * 2;
    static constexpr int kBoxBytesB = kBlockK * kBoxColumns * 2;  // 8 KB
    static constexpr int kStageBytesB = kBlockK * kBlockN * 2;
    // Each wgmma below is m64n128k16: a consumer issues BlockN / 128 of them per step of 16.
    static constexpr int kMmasAcross = BlockN / 128;
    // The stages, then their 2 x Stages mbarriers, and 1 KB to align the first stage
    // to the 1024 bytes (eight 128-byte rows) that the swizzle pattern repeats over.
    static constexpr int kSharedBytes = Stages * (kStageBytesA + kStageBytesB) + 2 * Stages * 8 + 1024;

    static_assert(BlockN % 128 == 0, "whole m64n128 MMAs across the tile");
    static_assert(kSharedBytes <= 227 * 1024, "an sm_90 block has at most 227 KB of shared memory");
};
// Wide: 128 x 256, four stages (193 KB, one block per SM): per FLOP, a quarter less
// of A and B read from L2 than 128 x 128. Narrow: for N that 256 does not divide, and
// where wide tiles would take more than half as many waves of blocks as narrow ones
// (chooseLaunch states the rule).
using HopperWidePlan = HopperPlan<256, 4>;
using HopperNarrowPlan = HopperPlan<128, 4>;
static_assert(kTileM % HopperNarrowPlan::kBlockM == 0 && kTileN % HopperNarrowPlan::kBlockN == 0,
              "the narrow plan must tile every shape the contract admits");

// ---- The pieces, each one PTX instruction -----------------------------------
// Shared memory addresses as the instructions take them: 32-bit, in the shared window.
__device__ __forceinline__ uint32_t sharedAddress(const void* pointer) {
    return static_cast<uint32_t>(__cvta_generic_to_shared(pointer));
}

__device__ __forceinline__ void initBarrier(uint64_t* barrier, int arrivals) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sharedAddress(barrier)), "r"(arrivals));
}

// One arrival, and the bytes that TMA will still deliver before this phase completes.
__device__ __forceinline__ void arriveExpectingBytes(uint64_t* barrier, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(sharedAddress(barrier)),
                 "r"(bytes) : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sharedAddress(barrier)) : "memory");
}

// Wait until the barrier's phase of this parity has completed. A barrier starts in
// phase 0, and the phase before it (parity 1) counts as completed: a wait for parity 1
// on a fresh barrier returns at once, which is how the producer's first pass through
// the stages finds every one of them empty.
__device__ __forceinline__ void waitBarrier(uint64_t* barrier, int parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n .reg .pred completed;\n"
            " mbarrier.try_wait.parity.shared::cta.b64 completed, [%1], %2;\n"
            " selp.u32 %0, 1, 0, completed;\n}\n"
            : "=r"(done)
            : "r"(sharedAddress(barrier)), "r"(parity)
            : "memory");
    } while (!done);
}

// TMA: the box of `map` whose first element is (column, row), into shared memory at
// `destination`, swizzled as the map says; its bytes count towards `barrier`. Elements
// past the matrix's edge (K's last stage) arrive as zeros, and still count.
__device__ __forceinline__ void copyBox(void* destination, const CUtensorMap* map, int column, int row,
                                        uint64_t* barrier) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(sharedAddress(destination)),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(sharedAddress(barrier))
        : "memory");
}

// How wgmma finds a matrix in shared memory: a 64-bit descriptor of its start address,
// the byte distances between its 8-row groups of 16-byte pieces in the two
// directions (the PTX ISA's "matrix descriptor": leading and stride byte offsets), and
// the swizzle (1 in bits 62-63: 128-byte). Every field is in units of 16 bytes.
__device__ __forceinline__ uint64_t matrixDescriptor(uint32_t address, uint32_t leading_bytes,
                                                     uint32_t stride_bytes) {
    return static_cast<uint64_t>((address & 0x3FFFF) >> 4) | static_cast<uint64_t>(leading_bytes >> 4) << 16 |
           static_cast<uint64_t>(stride_bytes >> 4) << 32 | 1ull << 62;
}

// wgmma reads its accumulators' registers asynchronously. fence orders the
// registers' earlier writes (the zeros) before the next MMAs; commit closes a group
// of MMAs; wait<N> returns once at most N groups are still running.
__device__ __forceinline__ void mmaFence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void mmaCommit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int Pending>
__device__ __forceinline__ void mmaWait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}

// The compiler sees the accumulators as written by the wgmma statement itself; this
// empty statement, after mmaWait, tells it they change there, so that no read of them
// (the epilogue's) is moved above the wait.
template <int Count>
__device__ __forceinline__ void accumulatorsWrittenHere(float (&accumulators)[Count]) {
#pragma unroll
    for (int i = 0; i < Count; ++i) asm volatile("" : "+f"(accumulators[i])::"memory");
}

// d (64 x 128, FP32, 64 registers a thread) += A (64 x 16) @ B (16 x 128), both FP16
// in shared memory. The immediates: scale A and B by 1 (not -1); A not transposed
// (K-major: K runs along its rows, as a's do); B transposed (its rows run along N,
// as b's do: "MN-major"). The scale-d predicate is 1: D = A @ B + D.
__device__ __forceinline__ void mma64x128x16(float (&d)[64], uint64_t a_descriptor, uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, accumulate, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(a_descriptor), "l"(b_descriptor), "r"(1));
}

// The layouts, in bytes, as TMA's 128-byte swizzle leaves them:
//   A's stage: 128 rows of 64 halves, row r at 128 r. A consumer's 64 rows start at
//     64 x 128 bytes in; 8-row groups are 1024 bytes apart (the stride offset; K-major
//     swizzled layouts have no leading offset, and it is ignored); the next 16 of K
//     is 32 bytes further along each row.
//   B's stage: BlockN / 64 boxes of 64 rows (of K) by 64 halves (of N), 8 KB apart:
//     the leading offset, from one 64-wide run of N to the next. Rows are 128 bytes,
//     so 8-row groups of K are 1024 bytes apart (the stride offset), and the next 16
//     of K starts 2048 bytes in. An m64n128 MMA spans two boxes; the next one starts
//     two boxes on.
constexpr uint32_t kSwizzleGroupBytes = 1024;  // 8 rows of 128 bytes
// A's leading offset is ignored (above), and the field must hold something: 16 bytes,
// its unit, is what the PTX ISA's own examples write.
constexpr uint32_t kIgnoredLeadingBytes = 16;

// Whether the consumers wait for TMA and the producer for the consumers is not left
// to timing: gate.cu's ordering build defines these to fill every stage with NaN
// before the pipeline starts, to hold the producer before it fills each stage the
// first time (so a consumer that does not wait for `full` reads that NaN), and to
// hold each consumer before it multiplies a stage (so a producer that does not wait
// for `empty` has overwritten it by then). Either bug also loses an mbarrier's count,
// so the gate may hang instead: a time limit (planted_bugs.py's) makes that a
// failure too. Everywhere else they are nothing.
#ifndef DAY87_POISON_HOPPER_STAGES
#define DAY87_POISON_HOPPER_STAGES(stages, bytes)
#define DAY87_HOLD_HOPPER_PRODUCER(first_fill)
#define DAY87_HOLD_HOPPER_CONSUMER()
#endif

// ---- The pipeline's parts, the same in versions 2 and 3 -----------------------
// The ring of stages in shared memory, and each stage's two mbarriers. Both kernels
// walk it by position: the position-th stage filled since the block started sits in
// stage position % kStages, on pass position / kStages over the ring.
struct Ring {
    unsigned char* stages_a;
    unsigned char* stages_b;
    uint64_t* full;   // completes when TMA has written the stage
    uint64_t* empty;  // completes when every consumer warp is done with it
};

// The ring laid out in the block's shared memory (aligned as the swizzle needs), its
// barriers initialised by thread 0 and visible to every thread and to TMA.
template <class Plan>
__device__ __forceinline__ Ring setUpRing(unsigned char* shared_unaligned) {
    unsigned char* shared = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(shared_unaligned) + kSwizzleGroupBytes - 1) & ~uintptr_t{kSwizzleGroupBytes - 1});
    Ring ring;
    ring.stages_a = shared;
    ring.stages_b = ring.stages_a + Plan::kStages * Plan::kStageBytesA;
    ring.full = reinterpret_cast<uint64_t*>(ring.stages_b + Plan::kStages * Plan::kStageBytesB);
    ring.empty = ring.full + Plan::kStages;
    DAY87_POISON_HOPPER_STAGES(shared, Plan::kStages * (Plan::kStageBytesA + Plan::kStageBytesB));
    if (threadIdx.x == 0) {
        for (int stage = 0; stage < Plan::kStages; ++stage) {
            initBarrier(&ring.full[stage], 1);                      // the producer's one arrival
            initBarrier(&ring.empty[stage], Plan::kConsumerWarps);  // one per consumer warp
        }
        // The initialised barriers, visible to TMA (which completes them) as well.
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();
    return ring;
}

// Tile `index` of C in grouped order: down group_rows rows of tiles, then across to
// the next column, so that blocks running at the same time share rows of A and
// columns of B in L2 (version 1's order, kGroupRows; fast/tile_order.cu times others).
struct TileCoordinates {
    int row, col;
};

__device__ __forceinline__ TileCoordinates groupedTile(int index, int tiles_m, int tiles_n, int group_rows) {
    const int tiles_per_group = group_rows * tiles_n;
    const int first_row = index / tiles_per_group * group_rows;
    const int rows_in_group = min(tiles_m - first_row, group_rows);
    const int index_in_group = index % tiles_per_group;
    return TileCoordinates{first_row + index_in_group % rows_in_group, index_in_group / rows_in_group};
}

// The producer's part for one tile: its K stages into the ring, from `position` on.
// Returns the position after them.
template <class Plan>
__device__ __forceinline__ int produceTile(const Ring& ring, const CUtensorMap* map_a,
                                           const CUtensorMap* map_b, TileCoordinates tile, int k_tiles,
                                           int position) {
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++position) {
        const int stage = position % Plan::kStages, pass = position / Plan::kStages;  // pass over the ring
        waitBarrier(&ring.empty[stage], (pass & 1) ^ 1);  // the consumers' last use of it is over
        DAY87_HOLD_HOPPER_PRODUCER(pass == 0);
        arriveExpectingBytes(&ring.full[stage], Plan::kStageBytesA + Plan::kStageBytesB);
        copyBox(ring.stages_a + stage * Plan::kStageBytesA, map_a, k_tile * Plan::kBlockK,
                tile.row * Plan::kBlockM, &ring.full[stage]);
        for (int box = 0; box < Plan::kBlockN / Plan::kBoxColumns; ++box)
            copyBox(ring.stages_b + stage * Plan::kStageBytesB + box * Plan::kBoxBytesB, map_b,
                    tile.col * Plan::kBlockN + box * Plan::kBoxColumns, k_tile * Plan::kBlockK, &ring.full[stage]);
    }
    return position;
}

// A consumer's part for one tile: its 64 rows of C (kMmasAcross blocks of 64 FP32
// accumulators a thread), from the K stages at ring positions `position` on.
template <class Plan>
__device__ __forceinline__ void consumeTile(const Ring& ring, float (&accumulators)[Plan::kMmasAcross][64],
                                            int consumer, int k_tiles, int position) {
#pragma unroll
    for (int across = 0; across < Plan::kMmasAcross; ++across)
#pragma unroll
        for (int i = 0; i < 64; ++i) accumulators[across][i] = 0.0f;

    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++position) {
        const int stage = position % Plan::kStages, pass = position / Plan::kStages;
        waitBarrier(&ring.full[stage], pass & 1);  // TMA has written the whole stage
        DAY87_HOLD_HOPPER_CONSUMER();
        const uint32_t stage_a = sharedAddress(ring.stages_a + stage * Plan::kStageBytesA) + consumer * 64 * 128;
        const uint32_t stage_b = sharedAddress(ring.stages_b + stage * Plan::kStageBytesB);
        mmaFence();
#pragma unroll
        for (int step = 0; step < Plan::kBlockK / 16; ++step) {
            const uint64_t a_descriptor = matrixDescriptor(stage_a + step * 32, kIgnoredLeadingBytes, kSwizzleGroupBytes);
#pragma unroll
            for (int across = 0; across < Plan::kMmasAcross; ++across)
                mma64x128x16(accumulators[across],
                             a_descriptor,
                             matrixDescriptor(stage_b + across * 2 * Plan::kBoxBytesB + step * 2 * kSwizzleGroupBytes,
                                              Plan::kBoxBytesB, kSwizzleGroupBytes));
        }
        mmaCommit();
        mmaWait<0>();  // this warpgroup's MMAs have read the stage: it may be refilled
#pragma unroll
        for (int across = 0; across < Plan::kMmasAcross; ++across) accumulatorsWrittenHere(accumulators[across]);
        if (threadIdx.x % 32 == 0) arrive(&ring.empty[stage]);
    }
}

// The epilogue: thread t of a warp holds, of each 64 x 128 block of C, rows
// (warp's 16) + t / 4 and 8 below it, at columns 8 j + 2 (t % 4) and the one after,
// for j = 0..15: accumulators 4 j and 4 j + 1 on the first row, 4 j + 2 and 4 j + 3
// on the second. Each pair goes out as one 8-byte store, with the bias added once.
// A block's 16 pairs of bias values are all loaded before its first store: C and the
// bias are both float pointers, so the compiler may not move a load of one above a
// store to the other, and a load between stores waits its whole latency, 32 times
// a block (what that cost the fused op: checks/NOTES.md, "The Hopper kernel").
template <class Plan>
__device__ __forceinline__ void storeTile(const GemmOperands& operands,
                                          const float (&accumulators)[Plan::kMmasAcross][64], int consumer,
                                          TileCoordinates tile) {
    const int lane = threadIdx.x % 32;
    const size_t row =
        static_cast<size_t>(tile.row) * Plan::kBlockM + consumer * 64 + (threadIdx.x / 32 % 4) * 16 + lane / 4;
#pragma unroll
    for (int across = 0; across < Plan::kMmasAcross; ++across) {
        const int first_col = tile.col * Plan::kBlockN + across * 128 + 2 * (lane % 4);
        float2 bias[16];
#pragma unroll
        for (int j = 0; j < 16; ++j)  // bias[col] is added to every row of column col, once
            // (two 4-byte loads: a contiguous bias may start at any float, so 8 bytes
            // at a time could be misaligned)
            bias[j] = operands.bias
                          ? make_float2(operands.bias[first_col + 8 * j], operands.bias[first_col + 8 * j + 1])
                          : make_float2(0.0f, 0.0f);
#pragma unroll
        for (int j = 0; j < 16; ++j) {
            const int col = first_col + 8 * j;
            const float2 upper = make_float2(accumulators[across][4 * j] + bias[j].x,
                                             accumulators[across][4 * j + 1] + bias[j].y);
            const float2 lower = make_float2(accumulators[across][4 * j + 2] + bias[j].x,
                                             accumulators[across][4 * j + 3] + bias[j].y);
            *reinterpret_cast<float2*>(operands.c + row * operands.n + col) = upper;
            *reinterpret_cast<float2*>(operands.c + (row + 8) * operands.n + col) = lower;
        }
    }
}

// ---- Version 2: one block per tile -------------------------------------------
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads, 1)
    hopperGemmKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                     const GemmOperands operands) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char shared_unaligned[];
    const Ring ring = setUpRing<Plan>(shared_unaligned);
    const TileCoordinates tile = groupedTile(blockIdx.x, operands.m / Plan::kBlockM, operands.n / Plan::kBlockN,
                                             kGroupRows);
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        // The producer: one thread issues every copy; the other 127 have nothing to do.
        if (threadIdx.x == 0) produceTile<Plan>(ring, &map_a, &map_b, tile, k_tiles, 0);
    } else {
        float accumulators[Plan::kMmasAcross][64];
        consumeTile<Plan>(ring, accumulators, warpgroup - 1, k_tiles, 0);
        storeTile<Plan>(operands, accumulators, warpgroup - 1, tile);
    }
#endif
}

// ---- Version 3: a persistent grid --------------------------------------------
// Version 2 launches a block per tile: each block sets up its ring, waits for its
// first stages to arrive while its tensor cores idle, and its SM takes the next
// block only once its epilogue is done. Version 3 launches one block per SM (or per
// tile, where there are fewer), and each block walks the tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... in grouped order. What that changes:
//   - the ring runs on from one tile into the next: while the consumers store a
//     tile, the producer is already filling the ring with the next tile's first
//     stages (the epilogue overlaps the next tile's loads; the MMAs wait for the
//     stores to be issued, not to land);
//   - the producer and the consumers count ring positions across tiles, so a
//     consumer's k-th stage of its i-th tile is position i * k_tiles + k;
//   - warp specialisation in registers too: the producer warpgroup gives registers
//     back (setmaxnreg.dec, to 40 a thread: it holds a few addresses) and the
//     consumers take them (setmaxnreg.inc, to 232: 128 accumulators and the rest).
//     Every thread starts with the cap that __launch_bounds__(384, 1) sets, 168
//     (65,536 / 384, down to the allocation's unit of 8), and an increase waits until
//     other warps have freed that many: what the producer frees must cover what the
//     consumers ask for, or they wait for ever. It takes effect only with that cap
//     and each role one branch of one if/else;
//   - the order of tiles: the group height is the launcher's, measured (fast/tile_order.cu).
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kRegistersAtEntry = 65536 / HopperPlan<128, 4>::kThreads / 8 * 8;  // every HopperPlan: 384 threads
static_assert(kProducerRegisters + 2 * kConsumerRegisters <= 3 * kRegistersAtEntry,
              "the consumers would ask for more registers than the producer frees");

template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads, 1)
    hopperPersistentKernel(const __grid_constant__ CUtensorMap map_a, const __grid_constant__ CUtensorMap map_b,
                           const GemmOperands operands, int group_rows) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char shared_unaligned[];
    const Ring ring = setUpRing<Plan>(shared_unaligned);
    const int tiles_m = operands.m / Plan::kBlockM, tiles_n = operands.n / Plan::kBlockN;
    const int tiles = tiles_m * tiles_n;
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
        if (threadIdx.x == 0) {
            int position = 0;
            for (int index = blockIdx.x; index < tiles; index += gridDim.x)
                position = produceTile<Plan>(ring, &map_a, &map_b,
                                             groupedTile(index, tiles_m, tiles_n, group_rows), k_tiles, position);
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
        float accumulators[Plan::kMmasAcross][64];
        int position = 0;
        for (int index = blockIdx.x; index < tiles; index += gridDim.x, position += k_tiles) {
            const TileCoordinates tile = groupedTile(index, tiles_m, tiles_n, group_rows);
            consumeTile<Plan>(ring, accumulators, warpgroup - 1, k_tiles, position);
            storeTile<Plan>(operands, accumulators, warpgroup - 1, tile);
        }
    }
#endif
}

// Whether this device runs sm_90a code: 1 only where the code that the driver chose
// for it was compiled with the Hopper kernels' bodies. Read once per device and thread
// (runsHopperCode, with the launchers).
__device__ int hopper_code_ran;

__global__ void hopperCodeProbe() {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    hopper_code_ran = 1;
#else
    hopper_code_ran = 0;
#endif
}
#endif  // CUDART_VERSION >= 12000

// ---------------------------------------------------------------------------
// The launchers
// ---------------------------------------------------------------------------
// What the launchers depend on that cannot change while the process runs: which code
// the driver runs on the device (the PTX architecture the kernels were compiled for:
// 75 in a T4's build, and in a compute_75 build on any card), whether that code has
// the Hopper kernel, and its number of SMs. Each thread asks the runtime once per
// device and keeps the answer, for each device it uses (currentDeviceFacts).
struct DeviceFacts {
    bool known;             // asked already
    bool turing;            // code for below sm_80: no cp.async (TuringPlan)
    bool dependent_launch;  // code for sm_90 and up, CUDA 12 or newer: letDependentsStart
    bool hopper;            // sm_90a code with hopperGemmKernel's body, and TMA's encoder
    int multiprocessors;
};

#if CUDART_VERSION >= 12000
// cuTensorMapEncodeTiled is the driver's, and the extension links no driver library
// (-lcuda: pip's toolkit and CI's machine have none to link against), so the runtime
// hands over the driver's function when it is first needed.
PFN_cuTensorMapEncodeTiled_v12000 tensorMapEncoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000, cudaEnableDefault, &found);
#else  // what runtimes before 12.5 have (deprecated from 13.0)
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
        return found == cudaDriverEntryPointSuccess ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function)
                                                    : nullptr;
    }();
    return encoder;
}

// Whether this device runs the Hopper kernel's body: only a card of capability 9.0 can,
// and only where the library holds sm_90a code, which the driver may not pick when it
// holds sm_90 code too. So hopperCodeProbe says which code ran (once per device and
// thread: currentDeviceFacts remembers), on a stream of its own, waited for alone.
// Relaxed capture mode lets this run while the caller's stream is being captured into
// a CUDA graph: nothing of it joins the graph.
cudaError_t runsHopperCode(int device, bool* hopper) {
    int major, minor;
    cudaError_t status = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
    if (status == cudaSuccess) status = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
    *hopper = false;
    if (status != cudaSuccess || major != 9 || minor != 0 || tensorMapEncoder() == nullptr) return status;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    if ((status = cudaThreadExchangeStreamCaptureMode(&mode)) != cudaSuccess) return status;
    cudaStream_t stream;
    int ran = 0;
    status = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
    if (status == cudaSuccess) {
        hopperCodeProbe<<<1, 1, 0, stream>>>();
        status = cudaGetLastError();
        if (status == cudaSuccess)
            status = cudaMemcpyFromSymbolAsync(&ran, hopper_code_ran, sizeof(int), 0, cudaMemcpyDeviceToHost, stream);
        const cudaError_t synchronized = cudaStreamSynchronize(stream);
        if (status == cudaSuccess) status = synchronized;
        cudaStreamDestroy(stream);
    }
    cudaThreadExchangeStreamCaptureMode(&mode);  // the caller's mode, back
    *hopper = status == cudaSuccess && ran == 1;
    return status;
}
#endif

// One entry per device ordinal, so that a thread that alternates between devices
// probes each once (runsHopperCode waits for its probe). A device past the last entry
// is asked at every call: correct, only slower.
constexpr int kDevicesRemembered = 64;

cudaError_t currentDeviceFacts(DeviceFacts* facts) {
    thread_local DeviceFacts remembered[kDevicesRemembered] = {};
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    DeviceFacts asked{};
    DeviceFacts& cached = device < kDevicesRemembered ? remembered[device] : asked;
    if (!cached.known) {
        cudaFuncAttributes compiled;
        if ((status = cudaFuncGetAttributes(&compiled, splitSumKernel)) != cudaSuccess) return status;
        int multiprocessors;
        status = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
        if (status != cudaSuccess) return status;
        bool hopper = false;
#if CUDART_VERSION >= 12000
        if ((status = runsHopperCode(device, &hopper)) != cudaSuccess) return status;
#endif
        cached = DeviceFacts{true, compiled.ptxVersion < 80,
                             compiled.ptxVersion >= 90 && CUDART_VERSION >= 12000, hopper, multiprocessors};
    }
    *facts = cached;
    return cudaSuccess;
}

// One plan on `stream`, with K in `splits` runs of whole stages (1: no split).
// `workspace` holds splits x M x N floats where splits > 1. The caller has checked
// that the plan's block tile divides M and N and that the sizes fit an int.
template <class Plan>
cudaError_t launchPlan(const GemmOperands& operands, int splits, float* workspace,
                       cudaStream_t stream) {
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

    DeviceFacts facts;
    if ((status = currentDeviceFacts(&facts)) != cudaSuccess) return status;
    const size_t vectors = static_cast<size_t>(operands.m) * operands.n / 4;
    const unsigned reduction_blocks = static_cast<unsigned>(std::min<size_t>((vectors + 255) / 256, 4096));
#if CUDART_VERSION >= 12000
    // The reduction as the multiply's dependent where the code has the wait for it
    // (sm_90 and up): its launch then overlaps the multiply instead of following it,
    // which measured faster (checks/NOTES.md). Older code has no wait, so there it is
    // launched in plain stream order. A CUDA graph captures either kind.
    cudaLaunchConfig_t config{};
    config.gridDim = dim3(reduction_blocks);
    config.blockDim = dim3(256);
    config.stream = stream;
    cudaLaunchAttribute dependent{};
    dependent.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    dependent.val.programmaticStreamSerializationAllowed = 1;
    config.attrs = &dependent;
    config.numAttrs = facts.dependent_launch ? 1 : 0;
    return cudaLaunchKernelEx(&config, splitSumKernel, operands, static_cast<const float*>(workspace), splits);
#else  // CUDA 11's runtime has no programmatic dependent launch
    splitSumKernel<<<reduction_blocks, 256, 0, stream>>>(operands, workspace, splits);
    return cudaGetLastError();
#endif
}

#if CUDART_VERSION >= 12000
// A row-major FP16 matrix (rows x columns) as TMA reads it: boxes of box_rows rows of
// 64 halves, 128-byte swizzled, zeros where a box sticks out past the edge. The
// encoder only writes the 128-byte map on the host: it costs no stream operation,
// and the map travels to the kernel by value, in its parameters.
cudaError_t describeMatrix(CUtensorMap* map, const half* data, int rows, int columns, int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensorMapEncoder();
    if (encode == nullptr) return cudaErrorNotSupported;  // a driver older than CUDA 12
    const cuuint64_t sizes[2] = {static_cast<cuuint64_t>(columns), static_cast<cuuint64_t>(rows)};  // inner first
    const cuuint64_t row_bytes[1] = {static_cast<cuuint64_t>(columns) * sizeof(half)};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result = encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<half*>(data), sizes,
                                   row_bytes, box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                   CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// One Hopper plan on `stream`. The caller has checked that the plan's block tile
// divides M and N, and that this device runs the kernel's body (DeviceFacts::hopper).
template <class Plan>
cudaError_t launchHopperPlan(const GemmOperands& operands, cudaStream_t stream) {
    CUtensorMap map_a, map_b;
    cudaError_t status = describeMatrix(&map_a, operands.a, operands.m, operands.k, Plan::kBlockM);
    if (status == cudaSuccess) status = describeMatrix(&map_b, operands.b, operands.k, operands.n, Plan::kBlockK);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(hopperGemmKernel<Plan>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int tiles = (operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN);
    hopperGemmKernel<Plan><<<tiles, Plan::kThreads, Plan::kSharedBytes, stream>>>(map_a, map_b, operands);
    return cudaGetLastError();
}

// The persistent kernel's order of tiles: down this many rows of tiles before moving
// across. fast/tile_order.cu times 1 to 32 at the large shapes: the height hardly
// matters up to 8192 x 4096 x 4096, and where it does (8192^3) by less than a line's
// position moves a timing (checks/NOTES.md, "The Hopper kernel"), so version 1's
// height stays until a run shows more.
constexpr int kPersistentGroupRows = kGroupRows;

// One persistent plan on `stream`: a block per SM, or per tile where there are fewer.
// The caller has checked what launchHopperPlan's caller checks.
template <class Plan>
cudaError_t launchPersistentPlan(const GemmOperands& operands, cudaStream_t stream,
                                 int group_rows = kPersistentGroupRows) {
    DeviceFacts facts;
    cudaError_t status = currentDeviceFacts(&facts);
    CUtensorMap map_a, map_b;
    if (status == cudaSuccess) status = describeMatrix(&map_a, operands.a, operands.m, operands.k, Plan::kBlockM);
    if (status == cudaSuccess) status = describeMatrix(&map_b, operands.b, operands.k, operands.n, Plan::kBlockK);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(hopperPersistentKernel<Plan>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int tiles = (operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN);
    hopperPersistentKernel<Plan><<<std::min(tiles, facts.multiprocessors), Plan::kThreads, Plan::kSharedBytes,
                                   stream>>>(map_a, map_b, operands, group_rows);
    return cudaGetLastError();
}
#endif

// Which kernel a call runs: DAY87_FAST_KERNEL=persistent (version 3), hopper
// (version 2) or wmma (version 1) forces one, and unset (or auto) lets chooseLaunch
// choose. It is read at every call, so that one process
// can time both (fast/bench.py); a CUDA graph keeps the kernel it captured.
enum class KernelSwitch { kAuto, kPersistent, kHopper, kWmma, kUnknown };

KernelSwitch kernelSwitch() {
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (value == nullptr || !std::strcmp(value, "") || !std::strcmp(value, "auto")) return KernelSwitch::kAuto;
    if (!std::strcmp(value, "persistent")) return KernelSwitch::kPersistent;
    if (!std::strcmp(value, "hopper")) return KernelSwitch::kHopper;
    if (!std::strcmp(value, "wmma")) return KernelSwitch::kWmma;
    return KernelSwitch::kUnknown;
}

// Why DAY87_FAST_KERNEL cannot be honoured on the current device, or "" where it can:
// fast/binding.cpp raises with it before a launch, where the launcher itself could
// only answer an error code.
std::string kernelSwitchProblem() {
    const KernelSwitch wanted = kernelSwitch();
    const char* value = std::getenv("DAY87_FAST_KERNEL");
    if (wanted == KernelSwitch::kUnknown)
        return std::string("DAY87_FAST_KERNEL must be persistent, hopper, wmma or auto; got '") + value + "'";
    DeviceFacts facts;
    const bool hopper_kernel = wanted == KernelSwitch::kPersistent || wanted == KernelSwitch::kHopper;
    if (!hopper_kernel || currentDeviceFacts(&facts) != cudaSuccess || facts.hopper) return "";
    return std::string("DAY87_FAST_KERNEL=") + value +
           ", and this device does not run the Hopper kernels: they run only on a card of capability 9.0, from "
           "code built for sm_90a with CUDA 12 or newer (fast_op.py adds that target where such a card is "
           "visible, or none is)";
}

// Which plan and how many splits of K a call runs: chooseLaunch (below) alone decides,
// for the launcher and for the workspace size that binding.cpp allocates.
enum class PlanChoice { kSquare, kSmallGrid, kTuring, kHopperWide, kHopperNarrow, kPersistentWide, kPersistentNarrow };

struct LaunchChoice {
    PlanChoice plan;
    int splits;
};

// A 128 x 128 block walks all of K alone, so a grid of fewer such tiles than SMs
// leaves most of the card idle (the lesson's 256 x 512 output is 8 tiles for an
// H200's 132 SMs). There the launcher takes SmallGridPlan's 64 x 64 tiles, four times
// as many. Where even those are fewer than the SMs, K is split into enough runs to
// give every SM a block, each of at least kMinStagesPerSplit stages, so that its
// pipeline has stages in flight. Below kMinDepthToSplit one block per tile measured
// faster: a short K does not repay the reduction's launch. A T4's build keeps
// TuringPlan and splits it the same way. (checks/NOTES.md has the split table.)
//
// The Hopper kernels, where the device runs them, take every grid of at least as many
// 128 x 128 tiles as SMs: version 3, the persistent one (faster than version 2 at
// 4096^3 and 8192 x 4096 x 4096, level at 2048^3 and 8192^3: checks/NOTES.md, "The
// Hopper kernel"); version 2 only where forced. Smaller grids stay with version 1's small
// tiles and split K (the Hopper kernels do not split K, and lose there). The wide
// tile where 256 divides N and the wide grid takes at most half as many waves of
// blocks as the narrow one (a wave of wide tiles lasts about two of narrow ones;
// 2048^3: one wave of 128 wide tiles against two of 256 narrow ones, and the wide
// ones measured faster); else the narrow tile. Forced, a Hopper kernel takes every
// shape, wide where N allows, but K = 0: a tensor map of no columns cannot be
// encoded, and version 1 writes the bias (or zeros) there.
constexpr int kMinStagesPerSplit = 2;
constexpr int kMinDepthToSplit = 256;

cudaError_t chooseLaunch(int m, int n, int k, LaunchChoice* choice) {
    DeviceFacts facts;
    const cudaError_t status = currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    const KernelSwitch wanted = kernelSwitch();
    const bool forced_hopper = wanted == KernelSwitch::kPersistent || wanted == KernelSwitch::kHopper;
    if (wanted == KernelSwitch::kUnknown || (forced_hopper && !facts.hopper))
        return cudaErrorInvalidValue;  // kernelSwitchProblem says why
    const int large_tiles = (m / kTileM) * (n / kTileN);
#if CUDART_VERSION >= 12000
    if (facts.hopper && wanted != KernelSwitch::kWmma && k > 0 &&
        (forced_hopper || large_tiles >= facts.multiprocessors)) {
        const auto waves = [&](int tiles) { return (tiles + facts.multiprocessors - 1) / facts.multiprocessors; };
        const bool wide = n % HopperWidePlan::kBlockN == 0 &&
                          (forced_hopper || 2 * waves(large_tiles / 2) <= waves(large_tiles));
        if (wanted == KernelSwitch::kHopper)
            *choice = LaunchChoice{wide ? PlanChoice::kHopperWide : PlanChoice::kHopperNarrow, 1};
        else
            *choice = LaunchChoice{wide ? PlanChoice::kPersistentWide : PlanChoice::kPersistentNarrow, 1};
        return cudaSuccess;
    }
#endif
    choice->plan = facts.turing ? PlanChoice::kTuring
                   : large_tiles < facts.multiprocessors ? PlanChoice::kSmallGrid
                                                         : PlanChoice::kSquare;
    const bool small = choice->plan == PlanChoice::kSmallGrid;
    const int tiles = small ? (m / SmallGridPlan::kBlockM) * (n / SmallGridPlan::kBlockN) : large_tiles;
    const int stage_depth = facts.turing ? TuringPlan::kBlockK
                            : small      ? SmallGridPlan::kBlockK
                                         : SquarePlan::kBlockK;
    const int k_tiles = (k + stage_depth - 1) / stage_depth;
    const int wanted_splits = tiles && k >= kMinDepthToSplit ? (facts.multiprocessors + tiles - 1) / tiles : 1;
    choice->splits = std::max(1, std::min({wanted_splits, k_tiles / kMinStagesPerSplit, kMaxSplits}));
    return cudaSuccess;
}

// The bytes of workspace launchFastGemm needs for this shape on the current device:
// 0 where K is not split.
size_t fastGemmWorkspaceBytes(size_t m, size_t n, size_t k) {
    LaunchChoice choice{PlanChoice::kSquare, 1};
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX ||
        chooseLaunch(static_cast<int>(m), static_cast<int>(n), static_cast<int>(k), &choice) != cudaSuccess)
        return 0;  // the launch then fails with the same error, and says so
    return choice.splits > 1 ? choice.splits * m * n * sizeof(float) : 0;
}

// The plan chosen for these operands, on `stream`. It checks the shape rules again,
// because a caller that skipped them would read and write out of bounds; it answers
// cudaErrorInvalidValue instead.
cudaError_t launchChosenPlan(const GemmOperands& operands, float* workspace, cudaStream_t stream) {
    if (operands.m < 0 || operands.n < 0 || operands.k < 0 || operands.m % kTileM != 0 ||
        operands.n % kTileN != 0 || operands.k % kTileK != 0)
        return cudaErrorInvalidValue;
    if (operands.m == 0 || operands.n == 0) return cudaSuccess;  // an empty C: nothing to launch
    LaunchChoice choice;
    const cudaError_t status = chooseLaunch(operands.m, operands.n, operands.k, &choice);
    if (status != cudaSuccess) return status;
    // The caller sized the workspace from an earlier reading of DAY87_FAST_KERNEL; if
    // another thread changed it since (hopper then, unset now), a split may have no
    // workspace: refused. (Where both readings split K, they split it alike: auto and
    // wmma choose version 1's plans by the same rule.)
    if (choice.splits > 1 && workspace == nullptr) return cudaErrorInvalidValue;
    switch (choice.plan) {
        case PlanChoice::kTuring: return launchPlan<TuringPlan>(operands, choice.splits, workspace, stream);
        case PlanChoice::kSmallGrid: return launchPlan<SmallGridPlan>(operands, choice.splits, workspace, stream);
#if CUDART_VERSION >= 12000
        case PlanChoice::kHopperWide: return launchHopperPlan<HopperWidePlan>(operands, stream);
        case PlanChoice::kHopperNarrow: return launchHopperPlan<HopperNarrowPlan>(operands, stream);
        case PlanChoice::kPersistentWide: return launchPersistentPlan<HopperWidePlan>(operands, stream);
        case PlanChoice::kPersistentNarrow: return launchPersistentPlan<HopperNarrowPlan>(operands, stream);
#else
        case PlanChoice::kHopperWide: case PlanChoice::kHopperNarrow:
        case PlanChoice::kPersistentWide: case PlanChoice::kPersistentNarrow: return cudaErrorNotSupported;
#endif
        case PlanChoice::kSquare: break;
    }
    return launchPlan<SquarePlan>(operands, choice.splits, workspace, stream);
}

// What fast/binding.cpp calls: launches on `stream` and returns the launch status,
// with `workspace` as fastGemmWorkspaceBytes asked for and `bias` nullptr or N
// floats. Sizes past an int, or a grid of more tiles than a launch can hold, answer
// cudaErrorInvalidValue. fast/binding.cpp declares it too: a change to its
// parameters goes in both files.
cudaError_t launchFastGemm(const half* a, const half* b, const float* bias, float* c, size_t m,
                           size_t n, size_t k, float* workspace, cudaStream_t stream) {
    if (m > INT_MAX || n > INT_MAX || k > INT_MAX) return cudaErrorInvalidValue;
    if ((m / kTileM) * (n / kTileN) > INT_MAX) return cudaErrorInvalidValue;
    GemmOperands operands{};
    operands.a = a;
    operands.b = b;
    operands.c = c;
    operands.m = static_cast<int>(m);
    operands.n = static_cast<int>(n);
    operands.k = static_cast<int>(k);
    operands.bias = bias;
    return launchChosenPlan(operands, workspace, stream);
}

// ---------------------------------------------------------------------------
// The backward's helpers
// ---------------------------------------------------------------------------
// fast/binding.cpp's wmmaMmBackwardCuda computes grad_a = grad @ b^T and grad_b = a^T @ grad
// with cuBLAS on tensor cores, FP16 in, FP32 accumulate, FP16 out. grad arrives in
// FP32, and cast as it is its small values would be lost (FP16's smallest normal is
// 2^-14, about 6e-5). So it is multiplied by the power of two that puts its largest
// magnitude in [2^14, 2^15) before the cast, and cuBLAS multiplies each FP32 sum by
// the inverse power of two (its alpha) before it rounds the product to FP16: exact,
// since only exponents move. The largest magnitude never leaves the device (cuBLAS
// reads alpha from device memory), so nothing here waits for the GPU.
//
// One kernel, because the scale needs every element's magnitude before the first
// element can be cast, and a grid-wide barrier can stand between the two: (1) every
// block finds the largest magnitude of its share and writes it out; (2) after the
// barrier every block reads all of them, so every block derives the same scale, and
// casts its share. Its share stays on chip between the two where the chip can hold
// it (registers, then shared memory), so that most of grad is read once.
constexpr int kHelperThreads = 256;
// Four blocks of 256 threads per SM, 64 registers a thread: a T4's SM holds no more
// threads, and an H200's register file is then full.
constexpr int kScaleBlocksPerMultiprocessor = 4;
// Each thread's first float4s of a dense grad, held in registers from (1) to (2).
constexpr int kRegisterVectors = 8;
// The partial maxima's workspace holds this many floats; fast/binding.cpp allocates it.
extern const int kMaxHelperBlocks = 1024;

// The largest |value| over this block's threads, in every thread's return value.
__device__ float blockLargest(float value) {
    __shared__ float warp_largest[kHelperThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2)
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = value;
    __syncthreads();
    value = warp_largest[0];
    for (int w = 1; w < kHelperThreads / 32; ++w) value = fmaxf(value, warp_largest[w]);
    return value;
}

// A grad that is row-major and whole (the usual case: (out * target).sum() hands over
// target itself) is read as one run of 16-byte float4s in sweeps across the whole
// grid, thread t taking float4 t of each sweep: the loads are as wide as they come,
// and every warp reads 512 contiguous bytes. Any other strides are walked rows by
// block and columns by thread, element by element, and read twice: coalesced for a
// row-major view, and right for any strides (autograd can hand over an expanded
// gradient: c.sum().backward() gives one with strides 0, 0).
struct StridedMatrix {
    const float* data;
    int64_t rows, cols, row_stride, col_stride;
    bool dense;  // row-major, whole, 16-byte aligned: read as float4s
};

// Four floats into four halves, each rounded once, written with one 8-byte store.
__device__ __forceinline__ void storeFourHalves(half* out, float4 value, float scale) {
    union {
        __half2 pairs[2];
        uint2 bits;
    } packed;
    packed.pairs[0] = __floats2half2_rn(value.x * scale, value.y * scale);
    packed.pairs[1] = __floats2half2_rn(value.z * scale, value.w * scale);
    *reinterpret_cast<uint2*>(out) = packed.bits;
}

__device__ __forceinline__ float largestOfFour(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Whether the cast waits for every block's largest magnitude is not left to timing:
// gate.cu's ordering build defines this to hold every block a while before it writes
// its own, so that a cast that does not wait reads the workspace's poison.
#ifndef DAY87_HOLD_PARTIAL_MAXIMA
#define DAY87_HOLD_PARTIAL_MAXIMA()
#endif

// Launched cooperatively (launchScaleToHalf): the runtime refuses the launch unless
// every block can be resident at once, which is what lets a block wait at the grid's
// barrier for blocks that would otherwise never start. `shared_vectors` float4s a
// thread are held in shared memory after the kRegisterVectors in registers.
__global__ void __launch_bounds__(kHelperThreads, kScaleBlocksPerMultiprocessor)
    scaleToHalfKernel(StridedMatrix grad, float* block_largest, half* scaled, float* alpha_and_beta,
                      int shared_vectors) {
    extern __shared__ float4 held_in_shared[];  // [sweep][thread]: conflict-free
    const float4* grad4 = reinterpret_cast<const float4*>(grad.data);
    const int64_t count = grad.rows * grad.cols, vectors = grad.dense ? count / 4 : 0;
    const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;  // one sweep
    const int64_t first_shared = first + kRegisterVectors * step;
    // This thread's sweeps in shared memory that hold data, counted first: a loop with
    // no early exit lets the compiler issue several loads before the first is used.
    const int shared_count = first_shared < vectors
        ? static_cast<int>(min((vectors - first_shared + step - 1) / step, static_cast<int64_t>(shared_vectors)))
        : 0;
    const int64_t first_unheld = first_shared + shared_vectors * step;

    // (1) The largest magnitude, keeping what the chip can hold.
    float4 held[kRegisterVectors];  // unrolled loops index it by constants: registers
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < kRegisterVectors; ++j) {
        const int64_t i = first + j * step;
        held[j] = i < vectors ? grad4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        largest = fmaxf(largest, largestOfFour(held[j]));
    }
#pragma unroll 4
    for (int j = 0; j < shared_count; ++j) {
        const float4 v = grad4[first_shared + j * step];
        held_in_shared[j * blockDim.x + threadIdx.x] = v;
        largest = fmaxf(largest, largestOfFour(v));
    }
#pragma unroll 4
    for (int64_t i = first_unheld; i < vectors; i += step) largest = fmaxf(largest, largestOfFour(grad4[i]));
    if (grad.dense) {
        for (int64_t i = 4 * vectors + first; i < count; i += step)  // the last count % 4
            largest = fmaxf(largest, fabsf(grad.data[i]));
    } else {
        for (int64_t row = blockIdx.x; row < grad.rows; row += gridDim.x)
            for (int64_t col = threadIdx.x; col < grad.cols; col += blockDim.x)
                largest = fmaxf(largest, fabsf(grad.data[row * grad.row_stride + col * grad.col_stride]));
    }
    largest = blockLargest(largest);
    DAY87_HOLD_PARTIAL_MAXIMA();
    if (threadIdx.x == 0) block_largest[blockIdx.x] = largest;
    // Every block's largest magnitude written and visible to every block (the barrier
    // orders memory too), and every warp of this one past blockLargest's shared reads.
    cooperative::this_grid().sync();

    // (2) The scale, the same in every block, and the cast.
    largest = 0.0f;
    for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x) largest = fmaxf(largest, block_largest[i]);
    largest = blockLargest(largest);
    // largest = m * 2^e with m in [0.5, 1), so largest * 2^(15 - e) is in [2^14, 2^15).
    // 2^(15 - e) is built from its FP32 bits, biased exponent 127 + 15 - e, clamped to
    // the normal range; its reciprocal, biased exponent 254 minus that, is exact too.
    int exponent;
    frexpf(largest, &exponent);
    const int biased = min(max(142 - exponent, 1), 253);
    const float scale = __int_as_float(biased << 23);
    if (blockIdx.x == 0 && threadIdx.x == 0) {  // cuBLAS's alpha (the unscale) and beta
        alpha_and_beta[0] = __int_as_float((254 - biased) << 23);
        alpha_and_beta[1] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRegisterVectors; ++j) {
        const int64_t i = first + j * step;
        if (i < vectors) storeFourHalves(scaled + 4 * i, held[j], scale);
    }
#pragma unroll 4
    for (int j = 0; j < shared_count; ++j)
        storeFourHalves(scaled + 4 * (first_shared + j * step), held_in_shared[j * blockDim.x + threadIdx.x], scale);
    // The rest newest first: what (1) read last is the likeliest to be still in L2
    // (measured faster than oldest first at 4096 x 4096: checks/NOTES.md).
    if (first_unheld < vectors) {
#pragma unroll 4
        for (int64_t i = first_unheld + (vectors - 1 - first_unheld) / step * step; i >= first_unheld; i -= step)
            storeFourHalves(scaled + 4 * i, grad4[i], scale);
    }
    if (grad.dense) {
        for (int64_t i = 4 * vectors + first; i < count; i += step)
            scaled[i] = __float2half_rn(grad.data[i] * scale);
        return;
    }
    for (int64_t row = blockIdx.x; row < grad.rows; row += gridDim.x)
        for (int64_t col = threadIdx.x; col < grad.cols; col += blockDim.x)
            scaled[row * grad.cols + col] = __float2half_rn(
                grad.data[row * grad.row_stride + col * grad.col_stride] * scale);
}

// How the scale kernel fits on the current device, asked once per device and thread.
struct ScaleFit {
    int device;
    int resident_blocks;  // blocks that can all be resident at once
    int shared_vectors;   // float4s a thread can hold in shared memory beside them
};

cudaError_t currentScaleFit(ScaleFit* fit) {
    thread_local ScaleFit cached{-1, 0, 0};
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    if (cached.device != device) {
        int multiprocessors, shared_per_multiprocessor, shared_per_block, reserved_per_block;
        const cudaDeviceAttr attributes[] = {cudaDevAttrMultiProcessorCount, cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                             cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                             cudaDevAttrReservedSharedMemoryPerBlock};
        int* values[] = {&multiprocessors, &shared_per_multiprocessor, &shared_per_block, &reserved_per_block};
        for (int i = 0; i < 4 && status == cudaSuccess; ++i)
            status = cudaDeviceGetAttribute(values[i], attributes[i], device);
        if (status != cudaSuccess) return status;
        // The SM's shared memory split among its blocks, less what the runtime reserves
        // for each and blockLargest's own, in whole sweeps of float4s.
        const int bytes = std::min(shared_per_block,
                                   shared_per_multiprocessor / kScaleBlocksPerMultiprocessor - reserved_per_block -
                                       static_cast<int>(kHelperThreads / 32 * sizeof(float)));
        const int shared_vectors = std::max(0, bytes / static_cast<int>(kHelperThreads * sizeof(float4)));
        const size_t shared_bytes = shared_vectors * kHelperThreads * sizeof(float4);
        status = cudaFuncSetAttribute(scaleToHalfKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared_bytes));
        int per_multiprocessor = 0;  // what the occupancy calculator says, not what was planned
        if (status == cudaSuccess)
            status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_multiprocessor, scaleToHalfKernel,
                                                                   kHelperThreads, shared_bytes);
        if (status != cudaSuccess) return status;
        cached = ScaleFit{device, per_multiprocessor * multiprocessors, shared_vectors};
    }
    *fit = cached;
    return cudaSuccess;
}

// grad (rows x cols, any strides) into `scaled` (row-major FP16), and into
// alpha_and_beta[0] the power of two to divide the products by (alpha_and_beta[1] = 0:
// cuBLAS reads beta from device memory too). `workspace` holds kMaxHelperBlocks floats.
cudaError_t launchScaleToHalf(const float* grad, int64_t rows, int64_t cols, int64_t row_stride,
                              int64_t col_stride, half* scaled, float* alpha_and_beta, float* workspace,
                              cudaStream_t stream) {
    ScaleFit fit;
    cudaError_t status = currentScaleFit(&fit);
    if (status != cudaSuccess) return status;
    const bool dense = col_stride == 1 && row_stride == cols && reinterpret_cast<std::uintptr_t>(grad) % 16 == 0;
    StridedMatrix matrix{grad, rows, cols, row_stride, col_stride, dense};
    // Enough blocks to hold a dense grad in registers, or one per row of a strided
    // one, up to what can be resident; shared memory only where registers fall short.
    const int64_t wanted = dense ? (rows * cols / 4 + kRegisterVectors * kHelperThreads - 1) /
                                       (kRegisterVectors * kHelperThreads)
                                 : rows;
    const int blocks = static_cast<int>(
        std::min<int64_t>(std::max<int64_t>(wanted, 1), std::min(fit.resident_blocks, kMaxHelperBlocks)));
    int shared_vectors = dense && wanted > blocks ? fit.shared_vectors : 0;
    void* arguments[] = {&matrix, &workspace, &scaled, &alpha_and_beta, &shared_vectors};
    return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(scaleToHalfKernel), blocks, kHelperThreads,
                                       arguments, shared_vectors * kHelperThreads * sizeof(float4), stream);
}

}  // namespace tuned
