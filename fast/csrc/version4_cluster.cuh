// fast/csrc/version4_cluster.cuh: version 4 of the fast forward, hopperClusterKernel, for
// Hopper (sm_90a code): version 3's persistent pipeline in clusters of two blocks, with B's
// stages multicast and C stored by TMA.
//
// What it adds to version 3:
//   - clusters: the two blocks of a cluster take the tiles one above the other, rows
//     2 r and 2 r + 1 of one column of tiles, so each stage of B that one needs the
//     other needs too. Each block loads half of that stage's B boxes and TMA
//     multicasts them into both blocks' shared memory: B is read from L2 once per
//     cluster, not once per block, and each block reads a third less per stage
//     (A's 16 KB and half of B's 32 KB, against 48 KB, in the wide plan);
//   - a stage is written by both producers, so it may be refilled only when both
//     blocks' consumers are done with it: each consumer warp arrives on the `empty`
//     barrier of every block in the cluster (a remote arrive, through the cluster's
//     shared memory window), and `empty` counts 2 x 8 arrivals;
//   - C goes out through shared memory: each consumer writes 64 x 32 FP32 at a time
//     into one of two staging buffers (8 KB each, 128-byte swizzled as the tensor map
//     reads it, so that a warp's writes hit every bank once), and one thread issues a
//     TMA store of it. The consumer goes on to the next sub-tile, and then to the
//     next tile's MMAs, while the store drains; before it writes a buffer again it
//     waits only until the store that last read it has read it;
//   - the cluster's blocks start together (their barriers initialised before either
//     arrives on the other's) and end together (neither leaves while the other may
//     still arrive on its barriers);
//   - the order of tiles: clusters walk pairs of tile rows in version 3's groups of
//     kGroupRows tile rows (4 pairs), so that the blocks resident at one time share
//     rows of A and columns of B in L2.
// Where M is an odd number of 128-row tiles, the launcher chooses version 3.
//
// In order: the cluster's PTX pieces, the producer, the consumers (version 3's, with
// the remote arrive), the epilogue through shared memory, the kernel, its launcher.

#pragma once

#include <algorithm>

#include "common.cuh"

namespace tuned {
namespace version4 {

#if CUDART_VERSION >= 12000  // tensor maps, clusters and __grid_constant__: CUDA 12's headers
constexpr int kClusterSize = 2;  // blocks per cluster, one above the other along M

// C's staging, per consumer warpgroup: two buffers of its 64 rows by 32 FP32 columns,
// 128 bytes a row: the widest box the 128-byte swizzle takes.
constexpr int kStoreColumns = 32, kStoreRows = 64, kStoreBuffers = 2;
constexpr int kStoreBufferBytes = kStoreRows * kStoreColumns * 4;  // 8 KB

// Shared memory: version 3's ring, then (from the next 1024-byte boundary past its
// barriers) the two consumers' staging buffers.
template <class Plan>
struct ClusterLayout {
    static constexpr int kRingBytes = Plan::kStages * (Plan::kStageBytesA + Plan::kStageBytesB);
    static constexpr int kStagingBytes = 2 * kStoreBuffers * kStoreBufferBytes;
    static constexpr int kSharedBytes = Plan::kSharedBytes + kSwizzleGroupBytes + kStagingBytes;
    static_assert(2 * Plan::kStages * 8 <= kSwizzleGroupBytes, "the barriers fit before staging");
    static_assert(kSharedBytes <= 227 * 1024, "an sm_90 block has at most 227 KB of shared memory");
    static_assert(Plan::kBlockN % kStoreColumns == 0, "whole staging boxes across the tile");
    static_assert(Plan::kBlockN / Plan::kBoxColumns % kClusterSize == 0,
                  "B's boxes split evenly between the cluster's blocks");
    // More than half an SM's 228 KB: one block an SM, whichever plan (so one count of
    // resident clusters serves both: launch_policy.cu's residentClustersOrNone).
    static_assert(2 * kSharedBytes > 228 * 1024, "one block an SM");
};

// ---- The cluster's pieces, each one PTX instruction --------------------------
__device__ __forceinline__ int clusterRank() {
    uint32_t rank;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    return static_cast<int>(rank);
}

// Every thread of both blocks arrives, then waits for all the others: release and
// acquire, so what one block did before (its barriers' initialisation) is seen by
// the other after.
__device__ __forceinline__ void clusterSync() {
    asm volatile("barrier.cluster.arrive.release;\n"
                 "barrier.cluster.wait.acquire;\n" ::: "memory");
}

// One arrival on the barrier at the same place in block `rank`'s shared memory:
// mapa turns this block's address into that block's, in the cluster's window. The
// arrival keeps mbarrier.arrive's default order (release at the block's scope), as
// CUTLASS's ClusterBarrier::arrive does: what it must order, the MMAs' reads of the
// stage, is already complete (mmaWait), and a release at the cluster's scope is a
// memory barrier that each consumer warp would wait for at every stage.
__device__ __forceinline__ void arriveInBlock(uint64_t* barrier, int rank) {
    asm volatile(
        "{\n .reg .b32 remote;\n"
        " mapa.shared::cluster.u32 remote, %0, %1;\n"
        " mbarrier.arrive.shared::cluster.b64 _, [remote];\n}\n"
        ::"r"(sharedAddress(barrier)), "r"(rank) : "memory");
}

// TMA multicast: the box at (column, row), written at `destination` in every block of
// the cluster whose bit is set in `blocks`, each completing the bytes on its own
// barrier at `barrier`'s place.
__device__ __forceinline__ void multicastBox(void* destination, const CUtensorMap* map,
                                             int column, int row, uint64_t* barrier,
                                             uint16_t blocks) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        ".multicast::cluster [%0], [%1, {%2, %3}], [%4], %5;\n"
        ::"r"(sharedAddress(destination)), "l"(reinterpret_cast<uint64_t>(map)), "r"(column),
        "r"(row), "r"(sharedAddress(barrier)), "h"(blocks)
        : "memory");
}

// The consumer's 128 threads meet at a barrier of their own (1 and 2; 0 is
// __syncthreads'), without the producer or the other consumer.
__device__ __forceinline__ void consumerBarrier(int consumer) {
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + consumer) : "memory");
}

// TMA store: the staging box at `source` to C at (column, row), as one bulk group.
__device__ __forceinline__ void storeBox(const CUtensorMap* map, int column, int row,
                                         uint32_t source) {
    asm volatile(
        "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n"
        "cp.async.bulk.commit_group;\n"
        ::"l"(reinterpret_cast<uint64_t>(map)), "r"(column), "r"(row), "r"(source) : "memory");
}

// Wait until at most Pending of this thread's bulk stores still read shared memory.
template <int Pending>
__device__ __forceinline__ void waitStoresRead() {
    asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(Pending) : "memory");
}

// Wait until every one of this thread's bulk stores has written C.
__device__ __forceinline__ void waitStoresWritten() {
    asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
}

// Two FP32 into shared memory at `address` (8-byte aligned): st.shared, not a store
// through a generic pointer, which the compiler leaves generic here.
__device__ __forceinline__ void storeShared(uint32_t address, float2 value) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(address), "f"(value.x), "f"(value.y)
                 : "memory");
}

// The generic proxy's writes to shared memory (st.shared), visible to TMA's reads.
__device__ __forceinline__ void fenceSharedForTma() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- The producer, the consumers and the epilogue ----------------------------
// The producer's part for one tile: its K stages into the ring, from `position` on:
// A's box for itself, and its half of B's boxes for both blocks. The stage's `full`
// barrier expects all of it: its own A and both halves of B.
template <class Plan>
__device__ __forceinline__ int produceTile(const Ring& ring, const CUtensorMap* map_a,
                                           const CUtensorMap* map_b, TileCoordinates tile,
                                           int k_tiles, int position, int rank) {
    constexpr int kBoxesEach = Plan::kBlockN / Plan::kBoxColumns / kClusterSize;
    constexpr uint16_t kEveryBlock = (1 << kClusterSize) - 1;
    for (int k_tile = 0; k_tile < k_tiles; ++k_tile, ++position) {
        const int stage = position % Plan::kStages,
                  pass = position / Plan::kStages;  // pass over the ring
        // both blocks' consumers are done with it
        waitBarrier(&ring.empty[stage], (pass & 1) ^ 1);
        DAY87_HOLD_HOPPER_PRODUCER(pass == 0);
        arriveExpectingBytes(&ring.full[stage], Plan::kStageBytesA + Plan::kStageBytesB);
        copyBox(ring.stages_a + stage * Plan::kStageBytesA, map_a, k_tile * Plan::kBlockK,
                tile.row * Plan::kBlockM, &ring.full[stage]);
        for (int box = rank * kBoxesEach; box < (rank + 1) * kBoxesEach; ++box)
            multicastBox(ring.stages_b + stage * Plan::kStageBytesB + box * Plan::kBoxBytesB,
                         map_b, tile.col * Plan::kBlockN + box * Plan::kBoxColumns,
                         k_tile * Plan::kBlockK, &ring.full[stage], kEveryBlock);
    }
    return position;
}

// A consumer's part for one tile, as version 3's, but a warp that is done with a
// stage tells both blocks' producers: each of them wrote part of it.
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
        if (threadIdx.x % 32 == 0)
            for (int rank = 0; rank < kClusterSize; ++rank) arriveInBlock(&ring.empty[stage], rank);
    }
}

// The epilogue: the accumulators (laid out as version 3's storeTile says), plus the
// bias, into a staging buffer, 32 columns at a time, and out by TMA. Each 16-byte
// piece of a 128-byte staging row sits at piece ^ (row % 8), as the map's swizzle
// reads it: the four threads that share a row write 32 contiguous bytes, and the
// eight rows of a warp's store land in eight different pieces, every bank once.
// The order for each buffer: the store that last read it has read it (the issuing
// thread waits, then the barrier tells the others); the writes; the fence that
// shows them to TMA; the barrier that says all 128 threads wrote; the store.
template <class Plan>
__device__ __forceinline__ void storeTile(const FastGemmOperands& operands,
                                          const CUtensorMap* map_c, unsigned char* staging,
                                          const float (&accumulators)[Plan::kMmasAcross][64],
                                          int consumer, TileCoordinates tile) {
    const int thread = threadIdx.x % 128, lane = threadIdx.x % 32;
    const bool issuer = thread == 0;
    const int row = (thread / 32) * 16 + lane / 4;  // and row + 8, in the consumer's 64
    const int first_row = tile.row * Plan::kBlockM + consumer * kStoreRows;  // of C
    const uint32_t buffers = sharedAddress(staging) + consumer * kStoreBuffers * kStoreBufferBytes;
#pragma unroll
    for (int sub_tile = 0; sub_tile < Plan::kBlockN / kStoreColumns; ++sub_tile) {
        const int across = sub_tile * kStoreColumns / 128;  // which 64 x 128 MMA block
        const int first_j = sub_tile * kStoreColumns % 128 / 8;  // its first 8 columns there
        const int first_col = tile.col * Plan::kBlockN + sub_tile * kStoreColumns;
        const uint32_t buffer = buffers + sub_tile % kStoreBuffers * kStoreBufferBytes;
        float2 bias[kStoreColumns / 8];
#pragma unroll
        for (int j = 0; j < kStoreColumns / 8; ++j)  // bias[col] once per column, as version 3
            bias[j] = operands.bias
                          ? make_float2(operands.bias[first_col + 8 * j + 2 * (lane % 4)],
                                        operands.bias[first_col + 8 * j + 2 * (lane % 4) + 1])
                          : make_float2(0.0f, 0.0f);
        if (issuer) waitStoresRead<kStoreBuffers - 1>();
        consumerBarrier(consumer);
#pragma unroll
        for (int j = 0; j < kStoreColumns / 8; ++j) {
            const float* values = &accumulators[across][4 * (first_j + j)];
            const int piece = (8 * j + 2 * (lane % 4)) / 4;  // 16-byte piece of the row
            const int byte = (8 * j + 2 * (lane % 4)) % 4 * 4;
#pragma unroll
            for (int half_row = 0; half_row < 2; ++half_row) {
                const int r = row + 8 * half_row;
                storeShared(buffer + r * 128 + (piece ^ (r % 8)) * 16 + byte,
                            make_float2(values[2 * half_row] + bias[j].x,
                                        values[2 * half_row + 1] + bias[j].y));
            }
        }
        fenceSharedForTma();
        consumerBarrier(consumer);
        if (issuer) storeBox(map_c, first_col, first_row, buffer);
    }
}

// ---- The kernel: a persistent grid of clusters --------------------------------
// Version 3's register budget: the producer gives back, the consumers take.
constexpr int kProducerRegisters = 40, kConsumerRegisters = 232;

// Launched in clusters of kClusterSize blocks (launchClusterPlan's launch attribute).
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads, 1)
    hopperClusterKernel(const __grid_constant__ CUtensorMap map_a,
                        const __grid_constant__ CUtensorMap map_b,
                        const __grid_constant__ CUtensorMap map_c,
                        const FastGemmOperands operands, int group_rows) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
    extern __shared__ unsigned char shared_unaligned[];
    const Ring ring = setUpRing<Plan>(shared_unaligned, kClusterSize);
    unsigned char* staging =
        ring.stages_a + ClusterLayout<Plan>::kRingBytes + kSwizzleGroupBytes;
    clusterSync();  // both blocks' barriers initialised before either arrives on the other's
    const int rank = clusterRank();
    const int pair_rows = operands.m / Plan::kBlockM / kClusterSize;
    const int tiles_n = operands.n / Plan::kBlockN;
    const int pairs = pair_rows * tiles_n;
    const int clusters = gridDim.x / kClusterSize, cluster = blockIdx.x / kClusterSize;
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;
    // The cluster's pair of tiles, and this block's tile of the two.
    const auto tileOf = [&](int index) {
        const TileCoordinates pair =
            groupedTile(index, pair_rows, tiles_n, max(1, group_rows / kClusterSize));
        return TileCoordinates{pair.row * kClusterSize + rank, pair.col};
    };

    const int warpgroup = threadIdx.x / 128;
    if (warpgroup == 0) {
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kProducerRegisters));
        if (threadIdx.x == 0) {
            int position = 0;
            for (int index = cluster; index < pairs; index += clusters)
                position = produceTile<Plan>(ring, &map_a, &map_b, tileOf(index), k_tiles,
                                             position, rank);
        }
    } else {
        asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kConsumerRegisters));
        float accumulators[Plan::kMmasAcross][64];
        int position = 0;
        for (int index = cluster; index < pairs; index += clusters, position += k_tiles) {
            consumeTile<Plan>(ring, accumulators, warpgroup - 1, k_tiles, position);
            storeTile<Plan>(operands, &map_c, staging, accumulators, warpgroup - 1,
                            tileOf(index));
        }
        // C's last stores are written before the block ends.
        if (threadIdx.x % 128 == 0) waitStoresWritten();
    }
    clusterSync();  // the other block's consumers may still arrive on this block's barriers
#endif
}

// C as TMA stores it: boxes of 64 rows by 32 FP32 (128 bytes), 128-byte swizzled, as
// storeTile writes its staging buffers.
cudaError_t describeOutput(CUtensorMap* map, float* data, int rows, int columns) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensorMapEncoder();
    if (encode == nullptr) return cudaErrorNotSupported;  // a driver older than CUDA 12
    const cuuint64_t sizes[2] = {static_cast<cuuint64_t>(columns),
                                 static_cast<cuuint64_t>(rows)};  // inner first
    const cuuint64_t row_bytes[1] = {static_cast<cuuint64_t>(columns) * sizeof(float)};
    const cuuint32_t box[2] = {kStoreColumns, kStoreRows};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, data, sizes, row_bytes, box,
               element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

// A launch of `blocks` blocks in clusters of kClusterSize, on `stream`. The cluster's
// size is a launch attribute, not the kernel's __cluster_dims__, so that code built
// for cards without clusters (a T4's) still compiles this file.
template <class Plan>
struct ClusterLaunch {
    cudaLaunchAttribute cluster;
    cudaLaunchConfig_t config;
    ClusterLaunch(int blocks, cudaStream_t stream) : cluster{}, config{} {
        cluster.id = cudaLaunchAttributeClusterDimension;
        cluster.val.clusterDim.x = kClusterSize;
        cluster.val.clusterDim.y = cluster.val.clusterDim.z = 1;
        config.gridDim = dim3(blocks);
        config.blockDim = dim3(Plan::kThreads);
        config.dynamicSmemBytes = ClusterLayout<Plan>::kSharedBytes;
        config.stream = stream;
        config.attrs = &cluster;
        config.numAttrs = 1;
    }
};

// How many clusters of this plan's kernel the device holds at once (each block takes
// an SM, and a cluster's two must share a GPC: an odd SM of a GPC stays idle).
// launch_policy.cu asks once per device and keeps the answer.
template <class Plan>
cudaError_t residentClusters(int* clusters) {
    cudaError_t status =
        cudaFuncSetAttribute(hopperClusterKernel<Plan>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize,
                             ClusterLayout<Plan>::kSharedBytes);
    if (status != cudaSuccess) return status;
    ClusterLaunch<Plan> launch(kClusterSize, nullptr);
    return cudaOccupancyMaxActiveClusters(clusters, hopperClusterKernel<Plan>, &launch.config);
}

// One cluster plan on `stream`: `clusters` clusters (residentClusters' count), or one
// per pair of tiles where there are fewer. The caller has checked that the plan's
// block tile divides N and that this device runs the kernel's body (launch_policy.cu's
// DeviceFacts::hopper); an odd number of tile rows (whose last row no cluster would
// write) or no clusters is refused here.
template <class Plan>
cudaError_t launchClusterPlan(const FastGemmOperands& operands, int clusters,
                              cudaStream_t stream, int group_rows = kGroupRows) {
    if (operands.m % (kClusterSize * Plan::kBlockM) != 0 || clusters < 1)
        return cudaErrorInvalidValue;
    CUtensorMap map_a, map_b, map_c;
    cudaError_t status = describeMatrix(&map_a, operands.a, operands.m, operands.k, Plan::kBlockM);
    if (status == cudaSuccess)
        status = describeMatrix(&map_b, operands.b, operands.k, operands.n, Plan::kBlockK);
    if (status == cudaSuccess) status = describeOutput(&map_c, operands.c, operands.m, operands.n);
    if (status == cudaSuccess)
        status = cudaFuncSetAttribute(hopperClusterKernel<Plan>,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      ClusterLayout<Plan>::kSharedBytes);
    if (status != cudaSuccess) return status;
    const int pairs = (operands.m / Plan::kBlockM / kClusterSize) * (operands.n / Plan::kBlockN);
    ClusterLaunch<Plan> launch(std::min(pairs, clusters) * kClusterSize, stream);
    return cudaLaunchKernelEx(&launch.config, hopperClusterKernel<Plan>, map_a, map_b, map_c,
                              operands, group_rows);
}
#endif  // CUDART_VERSION >= 12000

}  // namespace version4
}  // namespace tuned
