// fast/csrc/version5_split_cluster.cuh: version 5 of the fast forward,
// wmmaClusterSplitKernel: version 1's split K in one launch, on sm_90 and up.
//
// Version 1 splits K where the grid of tiles is too small for the card, and adds the
// splits' partial sums in a second kernel, through a workspace in global memory. On
// sm_90 the blocks that split one tile's K can form a thread block cluster, and a
// block of a cluster can read the others' shared memory (distributed shared memory).
// So here each block keeps its partial tile in its own shared memory, the cluster
// waits at one barrier, and each block adds one share of the tile's rows from every
// split, in split order, and stores them: one launch, no workspace, and the same bits
// as version 1's two launches (the same stages per split, added in the same order).
// It measured slower than version 1's two launches, so launch_policy.cu runs it only
// where DAY87_FAST_KERNEL=split forces it (fast/NOTES.md, "Version 5", has the
// figures).
//
// In order: the kernel, then launchClusterSplitPlan, which launches one plan.

#pragma once

#include <cooperative_groups.h>

#include "common.cuh"
#include "version1_wmma.cuh"

namespace tuned {
namespace version5 {

namespace cooperative = cooperative_groups;
using version1::Accumulator;
namespace wmma = nvcuda::wmma;

// The most splits, one block each, in a cluster: 8 is the cluster size that every
// sm_90 card launches without opting in to more.
constexpr int kMaxSplits = 8;

// A block's partial tile, in shared memory that the pipeline no longer needs: rows
// padded by 4 floats, as version 1's epilogue pads its strips, so that the 16 rows
// that one fragment store writes do not share banks.
template <class Plan>
constexpr int kPartialStride = Plan::kBlockN + 4;

// The cluster barrier's two halves, relaxed: an arrive that orders no memory (a
// cluster.sync() fences every earlier global store at the GPU's scope first, hundreds
// of cycles where stores are in flight), and the wait for every block's arrive.
// Because the arrive orders nothing, whatever must be done before it is made so by
// dataflow: mustHave(value) is an empty instruction that reads `value`, so the values
// are computed (their loads returned) before it, and the compiler keeps it ahead of
// the arrive (volatile asm statements keep their order).
__device__ __forceinline__ void mustHave(float4 value) {
    asm volatile("" ::"f"(value.x), "f"(value.y), "f"(value.z), "f"(value.w));
}

__device__ __forceinline__ void arriveInCluster() {
    asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void waitForCluster() {
    asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory");
}

// With gridDim.y splits, each block computes stages [rank * k_tiles_per_split, ...)
// of its tile's K, where rank is its place in its cluster of gridDim.y blocks, all
// on the same tile. Below sm_90 the body is empty: there are no clusters, and
// launchClusterSplitPlan refuses to launch it.
template <class Plan>
__global__ void __launch_bounds__(Plan::kThreads)
    wmmaClusterSplitKernel(const FastGemmOperands operands, int k_tiles_per_split) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    static_assert(Plan::kBlockM * kPartialStride<Plan> * 4 <= Plan::kSharedBytes,
                  "a partial tile must fit in the pipeline's shared memory");
    const cooperative::cluster_group cluster = cooperative::this_cluster();
    const int split = static_cast<int>(cluster.block_rank());
    const int splits = static_cast<int>(cluster.num_blocks());
    const int m = operands.m, n = operands.n, k = operands.k;
    extern __shared__ __align__(128) unsigned char shared_bytes[];
    half* shared_a = reinterpret_cast<half*>(shared_bytes);
    half* shared_b = shared_a + Plan::kStages * Plan::kStageHalvesA;
    int tile_row, tile_col;  // the cluster's blocks share blockIdx.x, and so the tile
    version1::groupedTile<Plan>(m, n, &tile_row, &tile_col);

    Accumulator accumulators[Plan::kFragmentsM][Plan::kFragmentsN];
#pragma unroll
    for (int i = 0; i < Plan::kFragmentsM; ++i)
#pragma unroll
        for (int j = 0; j < Plan::kFragmentsN; ++j) wmma::fill_fragment(accumulators[i][j], 0.0f);
    const int first_k_tile = split * k_tiles_per_split;
    const int k_tiles =
        min(k_tiles_per_split, (k + Plan::kBlockK - 1) / Plan::kBlockK - first_k_tile);
    version1::multiplyStages<Plan>(accumulators, operands.a, operands.b, k, n, shared_a,
                                   shared_b, tile_row, tile_col, first_k_tile, k_tiles);

    __syncthreads();  // every warp is done reading the pipeline's shared memory
    // gate.cu's ordering build holds every split but the first here, so that a block
    // that read the others' partial tiles before the barrier below would read them
    // unwritten.
    if (split != 0) DAY87_HOLD_PARTIAL_SUMS();
    float* partial = reinterpret_cast<float*>(shared_bytes);
    const int warp = threadIdx.x / 32;
    const int warp_row = warp / Plan::kWarpsN;
    const int warp_col = warp % Plan::kWarpsN;
#pragma unroll
    for (int i = 0; i < Plan::kFragmentsM; ++i)
#pragma unroll
        for (int j = 0; j < Plan::kFragmentsN; ++j)
            wmma::store_matrix_sync(
                partial + (warp_row * Plan::kWarpM + i * kWmmaSize) * kPartialStride<Plan> +
                    warp_col * Plan::kWarpN + j * kWmmaSize,
                accumulators[i][j], kPartialStride<Plan>, wmma::mem_row_major);
    // Every split's partial tile is written, and visible to the whole cluster: the
    // barrier's arrive releases this block's writes and its wait acquires the others'.
    cluster.sync();

    // This block's share of the tile's rows (vectors of four floats, row by row), each
    // added over the splits in split order (the order fixes the bits), the bias with
    // it, and stored once. Split by split, a thread issues the loads of all its vectors
    // before it adds any, and stores nothing until every split is added: a load from
    // another block's shared memory takes hundreds of cycles, and a store in between
    // would keep the next load behind it (the compiler cannot tell the two apart), so
    // that each vector would wait its own turn.
    constexpr int kVectorsPerRow = Plan::kBlockN / 4;
    // The most vectors one thread adds: two splits (the fewest) share the rows in halves.
    constexpr int kMostVectors =
        ((Plan::kBlockM + 1) / 2 * kVectorsPerRow + Plan::kThreads - 1) / Plan::kThreads;
    const int first_row = split * Plan::kBlockM / splits;
    const int share = ((split + 1) * Plan::kBlockM / splits - first_row) * kVectorsPerRow;
    const auto partial_vector = [&](int vector) {  // this block's own copy of a vector
        return reinterpret_cast<float4*>(partial + (first_row + vector / kVectorsPerRow) *
                                                       kPartialStride<Plan> +
                                         vector % kVectorsPerRow * 4);
    };
    float4 sums[kMostVectors];
    for (int other = 0; other < splits; ++other) {
        float4 parts[kMostVectors] = {};  // zeros past the share: added, never stored
#pragma unroll
        for (int i = 0; i < kMostVectors; ++i) {
            const int vector = threadIdx.x + i * Plan::kThreads;
            if (vector < share) parts[i] = *cluster.map_shared_rank(partial_vector(vector), other);
        }
#pragma unroll
        for (int i = 0; i < kMostVectors; ++i)
            sums[i] = other == 0 ? parts[i]
                                 : make_float4(sums[i].x + parts[i].x, sums[i].y + parts[i].y,
                                               sums[i].z + parts[i].z, sums[i].w + parts[i].w);
    }
    // Every read of another block's shared memory has returned (the sums hold them): no
    // block may leave, and its shared memory with it, before every block has come this
    // far. Arrived here, the stores below go on while the other blocks catch up.
#pragma unroll
    for (int i = 0; i < kMostVectors; ++i) mustHave(sums[i]);
    arriveInCluster();
#pragma unroll
    for (int i = 0; i < kMostVectors; ++i) {
        const int vector = threadIdx.x + i * Plan::kThreads;
        if (vector < share)
            version1::storeOutputs(
                operands, static_cast<size_t>(tile_row) * Plan::kBlockM + first_row +
                              vector / kVectorsPerRow,
                tile_col * Plan::kBlockN + vector % kVectorsPerRow * 4, sums[i]);
    }
    waitForCluster();
#endif
}

// One plan on `stream`, each tile's K in `splits` runs of whole stages, one cluster
// of `splits` blocks a tile (fewer where the stages do not fill them: no empty split,
// as in version 1; two at least, since a thread's share of the reduction is sized for
// half the rows). `sm90_code`: whether the device runs code for sm_90 or newer, built
// with CUDA 12 or newer (launch_policy.cu's DeviceFacts). Without it, for fewer than 2
// or more than kMaxSplits splits, or for K of fewer than two stages:
// cudaErrorInvalidValue (cudaErrorNotSupported from CUDA 11's runtime, which has no
// clusters). The caller has checked that the plan's block tile divides M and N and
// that the sizes fit an int.
template <class Plan>
cudaError_t launchClusterSplitPlan(const FastGemmOperands& operands, int splits, bool sm90_code,
                                   cudaStream_t stream) {
#if CUDART_VERSION >= 12000
    const int k_tiles = (operands.k + Plan::kBlockK - 1) / Plan::kBlockK;
    if (!sm90_code || splits < 2 || splits > kMaxSplits || k_tiles < 2)
        return cudaErrorInvalidValue;
    const int per_split = (k_tiles + splits - 1) / splits;
    splits = (k_tiles + per_split - 1) / per_split;  // no empty split; two at least
    cudaError_t status = cudaFuncSetAttribute(wmmaClusterSplitKernel<Plan>,
                                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                                              Plan::kSharedBytes);
    if (status != cudaSuccess) return status;
    cudaLaunchConfig_t config{};
    config.gridDim = dim3((operands.m / Plan::kBlockM) * (operands.n / Plan::kBlockN), splits);
    config.blockDim = dim3(Plan::kThreads);
    config.dynamicSmemBytes = Plan::kSharedBytes;
    config.stream = stream;
    // A cluster is one tile's splits: the blocks along y that share its blockIdx.x.
    cudaLaunchAttribute cluster{};
    cluster.id = cudaLaunchAttributeClusterDimension;
    cluster.val.clusterDim.x = 1;
    cluster.val.clusterDim.y = splits;
    cluster.val.clusterDim.z = 1;
    config.attrs = &cluster;
    config.numAttrs = 1;
    return cudaLaunchKernelEx(&config, wmmaClusterSplitKernel<Plan>, operands, per_split);
#else  // CUDA 11's runtime launches no clusters
    return cudaErrorNotSupported;
#endif
}

}  // namespace version5
}  // namespace tuned
