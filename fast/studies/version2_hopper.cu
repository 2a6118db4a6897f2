// fast/studies/version2_hopper.cu: version 2 of the fast forward, hopperGemmKernel, for
// Hopper (sm_90a code): a block per tile of C. A study, outside the package: the step
// between version 1 (fast/csrc/version1_wmma.cuh) and version 3, its pipeline in a
// persistent grid (fast/csrc/version3_persistent.cuh), which the launcher chooses where
// it would have chosen this, since the two measured level (fast/NOTES.md, "The Hopper
// kernel: versions 2 and 3"). fast/setup.py does not build it; the gates, the planted
// bugs and CI do, as below. From fast/,
//   diff studies/version2_hopper.cu csrc/version3_persistent.cuh
// shows what persistence adds (and, after the launcher, this file's driver, its own).
//
// Build and run from fast/, on an H100 or H200 (wgmma exists only in sm_90a code):
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o version2_hopper \
//       studies/version2_hopper.cu && ./version2_hopper
// The driver (main, at the end) checks both Hopper plans at the gate's Hopper shapes
// (fast/proof/gate_sm90.cuh) against float64 within test_op.py's bound, each shape
// twice for the same bits (fast/proof/gate_check.cuh's checkShape), then times version
// 2 beside version 3 at two large shapes and compares their outputs bit for bit. It
// exits 0 when every check passes. --small: shapes up to 512 and no timing (for
// compute-sanitizer); --no-timing: the checks alone (fast/proof/planted_bugs.py's study
// part). Add -DDAY87_ORDERING_BUILD for the gate's ordering build (gate_check.cuh): the
// stages start as NaN, the producer holds before it first fills each stage and each
// consumer before it multiplies one, so that a missing mbarrier wait fails or hangs.
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
// The kernel's body is empty in code for any target but sm_90a; there the driver refuses
// to run (launch_policy.cu's hopperCodeProbe says which code the device runs).
//
// In order: the producer, the consumers and the epilogue (what common.cuh's ring and
// PTX wrappers serve; version 3 holds the same three parts, unchanged), the kernel, its
// launcher, and the driver.

// First: the ordering build's holds, then the package's versions 1 and 3 (common.cuh's
// plans, PTX wrappers and ring among them), the reference and checkShape.
#include "../proof/gate_check.cuh"
#include "../proof/gate_sm90.cuh"  // checkHopperPlan: the Hopper plans' shapes

#if CUDART_VERSION < 12000
#error "version 2 needs CUDA 12's headers: tensor maps and __grid_constant__"
#endif

namespace tuned {
namespace version2 {

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
}  // namespace version2
}  // namespace tuned

// ---- The driver ---------------------------------------------------------------
// Versions 2 and 3 as gate_check.cuh's Launcher: a Hopper plan never splits K, so the
// splits and the workspace go unused.
template <class Plan>
cudaError_t launchVersion2(const tuned::FastGemmOperands& operands, int, float*,
                           cudaStream_t stream) {
    return tuned::version2::launchHopperPlan<Plan>(operands, stream);
}

template <class Plan>
cudaError_t launchVersion3(const tuned::FastGemmOperands& operands, int, float*,
                           cudaStream_t stream) {
    tuned::DeviceFacts facts;  // asked once per device, then remembered
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version3::launchPersistentPlan<Plan>(operands, facts.multiprocessors, stream);
}

// GPU microseconds per launch of each of `launches`, on the same operands, timed in turn
// as fast/bench/tile_order.cu times its orders: 7 rounds, each timing every launch once,
// as 20 launches right after 3 untimed ones (so each is timed after its own work, not its
// neighbour's); the median of its 7 timings.
std::vector<float> microsecondsInTurn(const std::vector<Launcher>& launches,
                                      const tuned::FastGemmOperands& operands) {
    cudaEvent_t start, end;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&end));
    std::vector<std::vector<float>> timings(launches.size());
    for (int round = 0; round < 7; ++round)
        for (size_t run = 0; run < launches.size(); ++run) {
            for (int i = 0; i < 3; ++i) CUDA_CHECK(launches[run](operands, 0, nullptr, 0));
            CUDA_CHECK(cudaEventRecord(start));
            for (int i = 0; i < 20; ++i) CUDA_CHECK(launches[run](operands, 0, nullptr, 0));
            CUDA_CHECK(cudaEventRecord(end));
            CUDA_CHECK(cudaEventSynchronize(end));
            float milliseconds;
            CUDA_CHECK(cudaEventElapsedTime(&milliseconds, start, end));
            timings[run].push_back(1000.0f * milliseconds / 20);
        }
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(end));
    std::vector<float> medians;
    for (auto& times : timings) {
        std::sort(times.begin(), times.end());
        medians.push_back(times[times.size() / 2]);
    }
    return medians;
}

// Version 2 beside version 3 on each plan, at two of the forward table's large shapes
// (fast/bench/bench.py's table A, where the two measured level), on fresh random FP16
// operands; then each one's C once more, which must have the same bits (a tile's MMAs
// and its stores are the same in both, in the same order). Returns whether they do.
template <class Plan>
bool timeBesideVersion3(const char* name, std::mt19937& generator) {
    const int shapes[][3] = {{4096, 4096, 4096}, {8192, 4096, 4096}};
    const std::vector<Launcher> launches = {launchVersion2<Plan>, launchVersion3<Plan>};
    std::normal_distribution<float> normal(0.0f, 1.0f);
    bool same = true;
    for (const auto& shape : shapes) {
        const int m = shape[0], n = shape[1], k = shape[2];
        std::vector<half> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
        for (auto& value : a) value = __float2half(normal(generator));
        for (auto& value : b) value = __float2half(normal(generator));
        tuned::FastGemmOperands operands{};
        half *device_a, *device_b;
        CUDA_CHECK(cudaMalloc(&device_a, a.size() * sizeof(half)));
        CUDA_CHECK(cudaMalloc(&device_b, b.size() * sizeof(half)));
        CUDA_CHECK(cudaMalloc(&operands.c, static_cast<size_t>(m) * n * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(device_a, a.data(), a.size() * sizeof(half), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(device_b, b.data(), b.size() * sizeof(half), cudaMemcpyHostToDevice));
        operands.a = device_a;
        operands.b = device_b;
        operands.m = m;
        operands.n = n;
        operands.k = k;
        const std::vector<float> times = microsecondsInTurn(launches, operands);
        std::vector<std::vector<float>> outputs;
        for (const Launcher launch : launches) {
            outputs.emplace_back(static_cast<size_t>(m) * n);
            CUDA_CHECK(cudaMemset(operands.c, 0xFF, outputs.back().size() * sizeof(float)));
            CUDA_CHECK(launch(operands, 0, nullptr, 0));
            CUDA_CHECK(cudaMemcpy(outputs.back().data(), operands.c,
                                  outputs.back().size() * sizeof(float), cudaMemcpyDeviceToHost));
        }
        const bool alike = std::memcmp(outputs[0].data(), outputs[1].data(),
                                       outputs[0].size() * sizeof(float)) == 0;
        printf("timed: %-26s %5d x %5d x %5d   version 2 %8.1f us, version 3 %8.1f us   %s\n",
               name, m, n, k, times[0], times[1],
               alike ? "the same bits" : "FAIL (version 2 and 3 gave other bits)");
        same &= alike;
        CUDA_CHECK(cudaFree(device_a));
        CUDA_CHECK(cudaFree(device_b));
        CUDA_CHECK(cudaFree(operands.c));
    }
    return same;
}

int main(int argc, char** argv) {
    bool timing = true;
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--small")) {
            size_limit = 512;  // for compute-sanitizer: small shapes, nothing timed
            timing = false;
        } else if (!std::strcmp(argv[i], "--no-timing")) {
            timing = false;
        } else {
            fprintf(stderr, "usage: %s [--small | --no-timing]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    requireDevice("version2_hopper", "an H100 or H200, to run sm_90a code");
    int device;
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
#ifdef DAY87_ORDERING_BUILD
    const char* build = ", ordering build (Hopper stages poisoned, their fills held)";
    timing = false;  // held back on purpose: its times would mean nothing
#else
    const char* build = "";
#endif
    printf("version2_hopper: %s, sm_%d%d, %d SMs%s%s\n", properties.name, properties.major,
           properties.minor, properties.multiProcessorCount, build,
           size_limit < INT_MAX ? ", shapes up to 512 only" : "");
    tuned::DeviceFacts facts;
    CUDA_CHECK(tuned::currentDeviceFacts(&facts));
    if (!facts.hopper) {  // nothing checked is no pass
        printf("version2_hopper: FAIL: this device runs no sm_90a code (a card of capability "
               "9.0 and -gencode=arch=compute_90a,code=sm_90a run it)\n");
        return EXIT_FAILURE;
    }
    using tuned::HopperNarrowPlan, tuned::HopperWidePlan;
    std::mt19937 generator(87);
    bool pass = checkHopperPlan<HopperWidePlan>("HopperWidePlan, version 2",
                                                launchVersion2<HopperWidePlan>, generator);
    pass &= checkHopperPlan<HopperNarrowPlan>("HopperNarrowPlan, version 2",
                                              launchVersion2<HopperNarrowPlan>, generator);
    if (timing && pass) {
        pass &= timeBesideVersion3<HopperWidePlan>("HopperWidePlan", generator);
        pass &= timeBesideVersion3<HopperNarrowPlan>("HopperNarrowPlan", generator);
    }
    printf("version2_hopper: %s\n", pass ? "PASS" : "FAIL");
    return pass ? EXIT_SUCCESS : EXIT_FAILURE;
}
