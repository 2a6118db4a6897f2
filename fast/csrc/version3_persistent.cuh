// fast/csrc/version3_persistent.cuh: version 3 of the fast forward, hopperPersistentKernel,
// for Hopper (sm_90a code): version 2's pipeline in a persistent grid.
//
// Version 2 (fast/studies/version2_hopper.cu, a study outside the package: it says how
// TMA, mbarriers and wgmma replace version 1's copies and WMMA) launches a block per
// tile: each block sets up its ring, waits for its first stages to arrive while its
// tensor cores idle, and its SM takes the next block only once its epilogue is done.
// Version 3 launches one block per SM (or per tile, where there are fewer), and each
// block walks the tiles blockIdx.x, blockIdx.x + gridDim.x, ... in grouped order. What
// that changes:
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
//   - the order of tiles: the group height is the launcher's, measured (fast/bench/tile_order.cu).
//
// In order: the producer, the consumers and the epilogue (version 2's, unchanged:
// `diff` this file with fast/studies/version2_hopper.cu for what persistence adds), the
// kernel, and its launcher.

#pragma once

#include <algorithm>

#include "common.cuh"

namespace tuned {
namespace version3 {

#if CUDART_VERSION >= 12000  // tensor maps and __grid_constant__: CUDA 12's headers
// ---- The producer, the consumers and the epilogue ----------------------------
// The producer's part for one tile: its K stages into the ring, from `position` on.
// Returns the position after them.
template <class Plan>
__device__ __forceinline__ int produceTile(const Ring& ring, const CUtensorMap* map_a,
                                           const CUtensorMap* map_b, TileCoordinates tile,
                                           int k_tiles, int position) {
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++position) {
        const int stage = position % Plan::kStages,
                  pass = position / Plan::kStages;  // pass over the ring
        waitBarrier(&ring.empty[stage], (pass & 1) ^ 1);  // the consumers' last use of it is over
        DAY87_HOLD_HOPPER_PRODUCER(pass == 0);
        arriveExpectingBytes(&ring.full[stage], Plan::kStageBytesA + Plan::kStageBytesB);
        copyBox(ring.stages_a + stage * Plan::kStageBytesA, map_a, k_tile * Plan::kBlockK,
                tile.row * Plan::kBlockM, &ring.full[stage]);
        for (int box = 0; box < Plan::kBlockN / Plan::kBoxColumns; ++box)
            copyBox(ring.stages_b + stage * Plan::kStageBytesB + box * Plan::kBoxBytesB, map_b,
                    tile.col * Plan::kBlockN + box * Plan::kBoxColumns, k_tile * Plan::kBlockK,
                    &ring.full[stage]);
    }
    return position;
}

// A consumer's part for one tile: its 64 rows of C (kMmasAcross blocks of 64 FP32
// accumulators a thread), from the K stages at ring positions `position` on.
template <class Plan>
__device__ __forceinline__ void consumeTile(const Ring& ring,
                                            float (&accumulators)[Plan::kMmasAcross][64],
                                            int consumer, int k_tiles, int position) {
#pragma unroll
    for (int across = 0; across < Plan::kMmasAcross; ++across)
#pragma unroll
        for (int i = 0; i < 64; ++i) accumulators[across][i] = 0.0f;

    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++position) {
        const int stage = position % Plan::kStages, pass = position / Plan::kStages;
        waitBarrier(&ring.full[stage], pass & 1);  // TMA has written the whole stage
        DAY87_HOLD_HOPPER_CONSUMER();
        const uint32_t stage_a =
            sharedAddress(ring.stages_a + stage * Plan::kStageBytesA) + consumer * 64 * 128;
        const uint32_t stage_b = sharedAddress(ring.stages_b + stage * Plan::kStageBytesB);
        mmaFence();
#pragma unroll
        for (int step = 0; step < Plan::kBlockK / 16; ++step) {
            const uint64_t a_descriptor =
                matrixDescriptor(stage_a + step * 32, kIgnoredLeadingBytes, kSwizzleGroupBytes);
#pragma unroll
            for (int across = 0; across < Plan::kMmasAcross; ++across)
                mma64x128x16(accumulators[across],
                             a_descriptor,
                             matrixDescriptor(stage_b + across * 2 * Plan::kBoxBytesB +
                                                  step * 2 * kSwizzleGroupBytes,
                                              Plan::kBoxBytesB, kSwizzleGroupBytes));
        }
        mmaCommit();
        mmaWait<0>();  // this warpgroup's MMAs have read the stage: it may be refilled
#pragma unroll
        for (int across = 0; across < Plan::kMmasAcross; ++across)
            accumulatorsWrittenHere(accumulators[across]);
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
// a block (what that cost the fused op: fast/NOTES.md, "The Hopper kernel: versions 2 and 3").
template <class Plan>
__device__ __forceinline__ void storeTile(const FastGemmOperands& operands,
                                          const float (&accumulators)[Plan::kMmasAcross][64],
                                          int consumer, TileCoordinates tile) {
    const int lane = threadIdx.x % 32;
    const size_t row = static_cast<size_t>(tile.row) * Plan::kBlockM + consumer * 64 +
                       (threadIdx.x / 32 % 4) * 16 + lane / 4;
#pragma unroll
    for (int across = 0; across < Plan::kMmasAcross; ++across) {
        const int first_col = tile.col * Plan::kBlockN + across * 128 + 2 * (lane % 4);
        float2 bias[16];
#pragma unroll
        for (int j = 0; j < 16; ++j)  // bias[col] is added to every row of column col, once
            // (two 4-byte loads: a contiguous bias may start at any float, so 8 bytes
            // at a time could be misaligned)
            bias[j] = operands.bias
                          ? make_float2(operands.bias[first_col + 8 * j],
                                        operands.bias[first_col + 8 * j + 1])
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

// ---- The kernel: a persistent grid --------------------------------------------
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;
constexpr int kRegistersAtEntry =
    65536 / HopperPlan<128, 4>::kThreads / 8 * 8;  // every HopperPlan: 384 threads
static_assert(kProducerRegisters + 2 * kConsumerRegisters <= 3 * kRegistersAtEntry,
              "the consumers would ask for more registers than the producer frees");

template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads, 1)
    hopperPersistentKernel(const __grid_constant__ CUtensorMap map_a,
                           const __grid_constant__ CUtensorMap map_b,
                           const FastGemmOperands operands, int group_rows) {
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
                                             groupedTile(index, tiles_m, tiles_n, group_rows),
                                             k_tiles, position);
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

// The persistent kernel's order of tiles: down this many rows of tiles before moving
// across. fast/bench/tile_order.cu times 1 to 32 at the large shapes: the height hardly
// matters up to 8192 x 4096 x 4096, and where it does (8192^3) by less than a line's
// position moves a timing (fast/NOTES.md, "The Hopper kernel: versions 2 and 3"), so
// version 1's height stays until a run shows more.
constexpr int kPersistentGroupRows = kGroupRows;

// One persistent plan on `stream`: a block per SM (`multiprocessors` of them), or per
// tile where there are fewer. The caller has checked that the plan's block tile
// divides M and N, and that this device runs the kernel's body (launch_policy.cu's
// DeviceFacts::hopper).
template <class Plan>
cudaError_t launchPersistentPlan(const FastGemmOperands& operands, int multiprocessors,
                                 cudaStream_t stream, int group_rows = kPersistentGroupRows) {
    CUtensorMap map_a, map_b;
    cudaError_t status = describeMatrix(&map_a, operands.a, operands.m, operands.k, Plan::kBlockM);
    if (status == cudaSuccess)
        status = describeMatrix(&map_b, operands.b, operands.k, operands.n, Plan::kBlockK);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(hopperPersistentKernel<Plan>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int tiles = (operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN);
    hopperPersistentKernel<Plan>
        <<<std::min(tiles, multiprocessors), Plan::kThreads, Plan::kSharedBytes, stream>>>(
            map_a, map_b, operands, group_rows);
    return cudaGetLastError();
}
#endif  // CUDART_VERSION >= 12000

}  // namespace version3
}  // namespace tuned
