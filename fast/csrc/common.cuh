// fast/csrc/common.cuh: what the fast operator's versions must agree on.
//
// The shape contract and the operands every kernel takes; then, for version 3 (Hopper,
// sm_90a code), the tile plans' constants, the PTX wrappers (mbarriers, TMA, wgmma), the
// swizzled layout that the tensor maps and the MMAs' descriptors share, and the ring of
// stages with its barriers. Each version's own loop, producer, consumers and epilogue are
// in its own file: version1_wmma.cuh, version3_persistent.cuh. launch_policy.cu includes
// them and chooses. Version 2, a study outside the package (fast/studies/version2_hopper.cu),
// includes this file too: its pipeline is version 3's, a block per tile.
//
// This header defines kTileM, kTileN and kTileK for fast/csrc/binding.cpp (extern const),
// so one translation unit includes it: launch_policy.cu (and the programs that include that
// file: fast/proof/gate.cu, fast/bench/tile_order.cu and the studies).
//
// Copied from the lesson's kernel.cu, not included (fast/ compiles no lesson source):
// the contract's numbers, kWmmaSize and kGroupRows. fast/README.md lists every copy.

#pragma once

#include <cuda.h>          // CUtensorMap and its enums: types only, no driver library is linked
#include <cudaTypedefs.h>  // the type of cuTensorMapEncodeTiled, which the runtime hands over
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <climits>
#include <cstddef>
#include <cstdint>

namespace tuned {

// ---------------------------------------------------------------------------
// The shape contract and the operands
// ---------------------------------------------------------------------------
// M and N multiples of 128 and K of 16 (the lesson's contract, copied): every plan the
// launcher may take for any shape divides it (version 1's three and the narrow Hopper plan,
// each checked by a static_assert; the wide one only where 256 divides N, which
// chooseLaunch asks). fast/csrc/binding.cpp declares these three and raises, naming the
// rule, before a call reaches the launcher.
constexpr int kWmmaSize = 16;  // the 16 x 16 x 16 FP16 fragment shape
extern const int kTileM = 128, kTileN = 128, kTileK = kWmmaSize;

// Blocks walk the tiles in groups of 8 block-rows, column by column, so that the blocks
// resident at one time share A rows and B columns and find them in L2 (the lesson's order;
// fast/bench/tile_order.cu times others on version 3).
constexpr int kGroupRows = 8;

// What one multiply reads and writes: the lesson's GemmOperands with the bias, under
// a name of fast/'s own. The kernels and the plan launchers take it whole.
// launchFastGemm zero-fills it (`operands{}`): wmma_mm passes no bias, so the bias is
// nullptr there, and the store tests it first.
struct FastGemmOperands {
    const half* a;      // M x K, row-major
    const half* b;      // K x N, row-major
    float* c;           // M x N, row-major
    int m, n, k;
    const float* bias;  // N values, one per column of C, or nullptr for none
};

// ---------------------------------------------------------------------------
// Version 3: the Hopper pipeline's parts (sm_90a code)
// ---------------------------------------------------------------------------
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
    static constexpr int kSharedBytes =
        Stages * (kStageBytesA + kStageBytesB) + 2 * Stages * 8 + 1024;

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
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(sharedAddress(barrier)),
                 "r"(arrivals));
}

// One arrival, and the bytes that TMA will still deliver before this phase completes.
__device__ __forceinline__ void arriveExpectingBytes(uint64_t* barrier, int bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 ::"r"(sharedAddress(barrier)), "r"(bytes) : "memory");
}

__device__ __forceinline__ void arrive(uint64_t* barrier) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(sharedAddress(barrier))
                 : "memory");
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
__device__ __forceinline__ void copyBox(void* destination, const CUtensorMap* map, int column,
                                        int row, uint64_t* barrier) {
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
    return static_cast<uint64_t>((address & 0x3FFFF) >> 4) |
           static_cast<uint64_t>(leading_bytes >> 4) << 16 |
           static_cast<uint64_t>(stride_bytes >> 4) << 32 | 1ull << 62;
}

// wgmma reads its accumulators' registers asynchronously. fence orders the
// registers' earlier writes (the zeros) before the next MMAs; commit closes a group
// of MMAs; wait<N> returns once at most N groups are still running.
__device__ __forceinline__ void mmaFence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mmaCommit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
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
__device__ __forceinline__ void mma64x128x16(float (&d)[64], uint64_t a_descriptor,
                                             uint64_t b_descriptor) {
    asm volatile(
        "{\n .reg .pred accumulate;\n setp.ne.b32 accumulate, %66, 0;\n"
        " wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 {"
        "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, "
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, "
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, "
        "%64, %65, accumulate, 1, 1, 0, 1;\n}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
          "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]),
          "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]),
          "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]),
          "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]),
          "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
          "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]),
          "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]),
          "+f"(d[63])
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
// to timing: the gate's ordering build (fast/proof/gate_check.cuh, which version 2's
// study shares) defines these to fill every stage with NaN before the pipeline starts,
// to hold the producer before it fills each stage the first time (so a consumer that
// does not wait for `full` reads that NaN), and to hold each consumer before it
// multiplies a stage (so a producer that does not wait for `empty` has overwritten it
// by then). Either bug also loses an mbarrier's count, so the gate may hang instead: a
// time limit (planted_bugs.py's) makes that a failure too. Everywhere else they are
// nothing.
#ifndef DAY87_POISON_HOPPER_STAGES
#define DAY87_POISON_HOPPER_STAGES(stages, bytes)
#define DAY87_HOLD_HOPPER_PRODUCER(first_fill)
#define DAY87_HOLD_HOPPER_CONSUMER()
#endif

// ---- The ring ------------------------------------------------------------------
// The ring of stages in shared memory, and each stage's two mbarriers. The kernel walks
// it by position: the position-th stage filled since the block started sits in stage
// position % kStages, on pass position / kStages over the ring.
struct Ring {
    unsigned char* stages_a;
    unsigned char* stages_b;
    uint64_t* full;   // completes when TMA has written the stage
    uint64_t* empty;  // completes when every consumer warp is done with it
};

// The ring laid out in the block's shared memory (aligned as the swizzle needs), its
// barriers initialised by thread 0 and visible to every thread and to TMA. A stage is
// empty once every consumer warp is done with it.
template <class Plan>
__device__ __forceinline__ Ring setUpRing(unsigned char* shared_unaligned) {
    unsigned char* shared = reinterpret_cast<unsigned char*>(
        (reinterpret_cast<uintptr_t>(shared_unaligned) + kSwizzleGroupBytes - 1) &
        ~uintptr_t{kSwizzleGroupBytes - 1});
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

// Tile `index` of C in grouped order: down group_rows rows of tiles, then across to the
// next column, so that blocks running at the same time share rows of A and columns of B in
// L2 (version 1's order, kGroupRows; fast/bench/tile_order.cu times others on version 3).
struct TileCoordinates {
    int row, col;
};

__device__ __forceinline__ TileCoordinates groupedTile(int index, int tiles_m, int tiles_n,
                                                       int group_rows) {
    const int tiles_per_group = group_rows * tiles_n;
    const int first_row = index / tiles_per_group * group_rows;
    const int rows_in_group = min(tiles_m - first_row, group_rows);
    const int index_in_group = index % tiles_per_group;
    return TileCoordinates{first_row + index_in_group % rows_in_group,
                           index_in_group / rows_in_group};
}

// ---- The tensor maps, built on the host --------------------------------------
// cuTensorMapEncodeTiled is the driver's, and the extension links no driver library
// (-lcuda: pip's toolkit and CI's machine have none to link against), so the runtime
// hands over the driver's function when it is first needed.
PFN_cuTensorMapEncodeTiled_v12000 tensorMapEncoder() {
    static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
        void* function = nullptr;
        cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
        cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &function, 12000,
                                         cudaEnableDefault, &found);
#else  // what runtimes before 12.5 have (deprecated from 13.0)
        cudaGetDriverEntryPoint("cuTensorMapEncodeTiled", &function, cudaEnableDefault, &found);
#endif
        return found == cudaDriverEntryPointSuccess
                   ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(function)
                   : nullptr;
    }();
    return encoder;
}

// A row-major FP16 matrix (rows x columns) as TMA reads it: boxes of box_rows rows of
// 64 halves, 128-byte swizzled, zeros where a box sticks out past the edge. The
// encoder only writes the 128-byte map on the host: it costs no stream operation,
// and the map travels to the kernel by value, in its parameters.
cudaError_t describeMatrix(CUtensorMap* map, const half* data, int rows, int columns,
                           int box_rows) {
    const PFN_cuTensorMapEncodeTiled_v12000 encode = tensorMapEncoder();
    if (encode == nullptr) return cudaErrorNotSupported;  // a driver older than CUDA 12
    const cuuint64_t sizes[2] = {static_cast<cuuint64_t>(columns),
                                 static_cast<cuuint64_t>(rows)};  // inner first
    const cuuint64_t row_bytes[1] = {static_cast<cuuint64_t>(columns) * sizeof(half)};
    const cuuint32_t box[2] = {64, static_cast<cuuint32_t>(box_rows)};
    const cuuint32_t element_strides[2] = {1, 1};
    const CUresult result =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, const_cast<half*>(data), sizes, row_bytes,
               box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    return result == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}
#endif  // CUDART_VERSION >= 12000

}  // namespace tuned
