// fast/csrc/version2_hopper.cuh: version 2 of the fast forward, hopperGemmKernel, for
// Hopper (sm_90a code): a block per tile of C.
//
// wmmaGemmKernel is version 1: every thread copies its share of each stage, and
// every warp multiplies 16 x 16 x 16 fragments (HMMA) that it loads from padded
// shared memory. On Hopper that reaches half of cuBLAS's speed (fast/NOTES.md, "The
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
// fast/setup.py adds that target wherever its list names 9.0, and the kernel's
// body is empty in every other target, where launch_policy.cu's hopperCodeProbe tells
// the launcher not to choose it.
//
// In order: the producer, the consumers and the epilogue (what common.cuh's ring
// and PTX wrappers serve), the kernel, and its launcher. version3_persistent.cuh
// holds the same three parts: `diff` the two files for what persistence adds.

#pragma once

#include "common.cuh"

namespace tuned {
namespace version2 {

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

// ---- The kernel: one block per tile -------------------------------------------
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads, 1)
    hopperGemmKernel(const __grid_constant__ CUtensorMap map_a,
                     const __grid_constant__ CUtensorMap map_b, const FastGemmOperands operands) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char shared_unaligned[];
    const Ring ring = setUpRing<Plan>(shared_unaligned);
    const TileCoordinates tile = groupedTile(blockIdx.x, operands.m / Plan::kBlockM,
                                             operands.n / Plan::kBlockN, kGroupRows);
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

// One Hopper plan on `stream`. The caller has checked that the plan's block tile
// divides M and N, and that this device runs the kernel's body (DeviceFacts::hopper).
template <class Plan>
cudaError_t launchHopperPlan(const FastGemmOperands& operands, cudaStream_t stream) {
    CUtensorMap map_a, map_b;
    cudaError_t status = describeMatrix(&map_a, operands.a, operands.m, operands.k, Plan::kBlockM);
    if (status == cudaSuccess)
        status = describeMatrix(&map_b, operands.b, operands.k, operands.n, Plan::kBlockK);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(hopperGemmKernel<Plan>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int tiles = (operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN);
    hopperGemmKernel<Plan><<<tiles, Plan::kThreads, Plan::kSharedBytes, stream>>>(
        map_a, map_b, operands);
    return cudaGetLastError();
}
#endif  // CUDART_VERSION >= 12000

}  // namespace version2
}  // namespace tuned
