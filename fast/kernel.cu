// fast/kernel.cu: the fast operator's kernels, day87_fast::wmma_mm and wmma_mm_bias's
// forward and the tensor-core backward's scaling kernel.
//
// The lesson's kernel.cu, tuned: the same WMMA fragments and FP32 accumulators under
// three tile plans (one chosen per call), K split across blocks where the grid of
// tiles is too small for the card (the partial sums added by a second, deterministic
// kernel, launched early as the multiply's programmatic dependent on sm_90), a bias
// added in the one store, and the backward's cooperative scaling kernel. Every
// figure behind a choice is in checks/NOTES.md.
//
// The lesson's kernel.cu is included first, outside this file's namespace: the shape
// contract (kTileM, kTileN, kTileK, which binding.cpp's rules read), the 16-byte
// copies, the pad, the block groups' size (kGroupRows) and CUDA_CHECK come from
// there, written once. Its own kernel and launcher are compiled here too and never
// called: a few seconds of build, the price of one file holding those numbers.
//
// Built two ways:
//   - by fast/fast_op.py, through the lesson's op.load_extension, with fast/binding.cpp;
//   - included by fast/gate.cu, the standalone check:
//       nvcc -O3 -arch=sm_90 -o fast/gate fast/gate.cu && fast/gate
//
// In order: the tile plans, the dependent-launch helpers, GemmOperands and
// storeOutputs (the one place that writes C, with the bias), the kernel, the split-K
// reduction, the launchers, and last the backward's scaling kernel.
//
// This file never exits and never synchronizes: the launchers return the launch
// status, and the caller (an operator that raises, or fast/gate.cu's CUDA_CHECK)
// decides what an error means.

#include "../kernel.cu"

#include <cooperative_groups.h>

#include <algorithm>

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
// kernels and the plan launchers take it whole. launchWmmaGemm zero-fills it
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
// The kernel
// ---------------------------------------------------------------------------
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
// The launchers
// ---------------------------------------------------------------------------
// What the launchers depend on that cannot change while the process runs: which code
// the driver runs on the device (the PTX architecture the kernels were compiled for:
// 75 in a T4's build, and in a compute_75 build on any card) and its number of SMs.
// Each thread asks the runtime once per device and keeps the answer.
struct DeviceFacts {
    int device;
    bool turing;            // code for below sm_80: no cp.async (TuringPlan)
    bool dependent_launch;  // code for sm_90 and up, CUDA 12 or newer: letDependentsStart
    int multiprocessors;
};

cudaError_t currentDeviceFacts(DeviceFacts* facts) {
    thread_local DeviceFacts cached{-1, false, false, 0};
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    if (cached.device != device) {
        cudaFuncAttributes compiled;
        if ((status = cudaFuncGetAttributes(&compiled, splitSumKernel)) != cudaSuccess) return status;
        int multiprocessors;
        status = cudaDeviceGetAttribute(&multiprocessors, cudaDevAttrMultiProcessorCount, device);
        if (status != cudaSuccess) return status;
        cached = DeviceFacts{device, compiled.ptxVersion < 80,
                             compiled.ptxVersion >= 90 && CUDART_VERSION >= 12000, multiprocessors};
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

// Which plan and how many splits of K a call runs: chooseLaunch (below) alone decides,
// for the launcher and for the workspace size that binding.cpp allocates.
enum class PlanChoice { kSquare, kSmallGrid, kTuring };

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
constexpr int kMinStagesPerSplit = 2;
constexpr int kMinDepthToSplit = 256;

cudaError_t chooseLaunch(int m, int n, int k, LaunchChoice* choice) {
    DeviceFacts facts;
    const cudaError_t status = currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    const int large_tiles = (m / kTileM) * (n / kTileN);
    choice->plan = facts.turing ? PlanChoice::kTuring
                   : large_tiles < facts.multiprocessors ? PlanChoice::kSmallGrid
                                                         : PlanChoice::kSquare;
    const bool small = choice->plan == PlanChoice::kSmallGrid;
    const int tiles = small ? (m / SmallGridPlan::kBlockM) * (n / SmallGridPlan::kBlockN) : large_tiles;
    const int stage_depth = facts.turing ? TuringPlan::kBlockK
                            : small      ? SmallGridPlan::kBlockK
                                         : SquarePlan::kBlockK;
    const int k_tiles = (k + stage_depth - 1) / stage_depth;
    const int wanted = tiles && k >= kMinDepthToSplit ? (facts.multiprocessors + tiles - 1) / tiles : 1;
    choice->splits = std::max(1, std::min({wanted, k_tiles / kMinStagesPerSplit, kMaxSplits}));
    return cudaSuccess;
}

// The bytes of workspace launchWmmaGemm needs for this shape on the current device:
// 0 where K is not split.
size_t wmmaGemmWorkspaceBytes(size_t m, size_t n, size_t k) {
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
    switch (choice.plan) {
        case PlanChoice::kTuring: return launchPlan<TuringPlan>(operands, choice.splits, workspace, stream);
        case PlanChoice::kSmallGrid: return launchPlan<SmallGridPlan>(operands, choice.splits, workspace, stream);
        case PlanChoice::kSquare: break;
    }
    return launchPlan<SquarePlan>(operands, choice.splits, workspace, stream);
}

// What fast/binding.cpp calls: launches on `stream` and returns the launch status,
// with `workspace` as wmmaGemmWorkspaceBytes asked for and `bias` nullptr or N
// floats. Sizes past an int, or a grid of more tiles than a launch can hold, answer
// cudaErrorInvalidValue. fast/binding.cpp declares it too: a change to its
// parameters goes in both files.
cudaError_t launchWmmaGemm(const half* a, const half* b, const float* bias, float* c, size_t m,
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
