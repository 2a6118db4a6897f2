// fast/proof/gate_sm90.cuh: the Hopper plans' checks (sm_90a code: wgmma and TMA). The shapes
// every Hopper plan is checked at, checkHopperPlan, which fast/proof/gate.cu runs on
// version 3 and fast/studies/version2_hopper.cu on version 2; and what the Hopper
// launcher adds to every call on the host, which the gate prints. Included after
// gate_check.cuh, whose checkShape it calls.
//
// CUDA 12's headers declare what these kernels need (tensor maps): with an older toolkit
// the gate checks version 1 and the launcher alone.

#pragma once

#include <chrono>

#include "gate_check.cuh"

#if CUDART_VERSION >= 12000
// One Hopper plan directly, where this device runs it: one tile and several, with M
// and N each one tile or two; every K the contract allows against the 64 of a stage
// (K = 16, a single step; 48, one part-filled stage; 272, four whole stages and 16;
// 320, five whole stages, one more than the ring holds); a K of 4096 (64 stages, so
// each mbarrier completes 16 phases); more tiles than the card has SMs (4096 x 1536:
// 192 wide tiles, 384 narrow, beside an H200's 132 SMs), so that version 2's blocks
// wait for a second wave and version 3's blocks take several tiles each, with K of
// six stages, so that its ring wraps inside a tile as well as between tiles; the
// bias, whole and with a tail; FP16's edges. Its lines name no split: the Hopper
// kernels never split K (splits 0 here: no workspace).
template <class Plan>
bool checkHopperPlan(const char* name, Launcher launch, std::mt19937& generator) {
    const int m = Plan::kBlockM, n = Plan::kBlockN;
    bool pass = true;
    for (int k : {16, 48, 272, 320}) pass &= checkShape(name, launch, 0, m, n, k, generator);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator);
    pass &= checkShape(name, launch, 0, 2 * m, n, 4096, generator);
    pass &= checkShape(name, launch, 0, 4096, 1536, 336, generator);
    for (int k : {48, 272})
        pass &= checkShape(name, launch, 0, 2 * m, 2 * n, k, generator, /*with_bias=*/true);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator, false, /*extremes=*/true);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator, true, /*extremes=*/true);
    return pass;
}

// What the Hopper launcher adds to every call on the host: encoding A's and B's tensor
// maps (the lesson's first shape; the encoder's cost does not depend on it).
void printTensorMapCost() {
    constexpr int kCalls = 10000;
    half* matrix;
    CUtensorMap map_a, map_b;
    CUDA_CHECK(cudaMalloc(&matrix, 512 * 384 * sizeof(half)));
    const auto start = std::chrono::steady_clock::now();
    for (int call = 0; call < kCalls; ++call) {
        CUDA_CHECK(tuned::describeMatrix(&map_a, matrix, 256, 384,
                                         tuned::HopperWidePlan::kBlockM));
        CUDA_CHECK(tuned::describeMatrix(&map_b, matrix, 384, 512,
                                         tuned::HopperWidePlan::kBlockK));
    }
    const std::chrono::duration<double, std::micro> spent =
        std::chrono::steady_clock::now() - start;
    printf("tensor maps: %.3f us of host time per call (A's and B's, 256 x 512 x 384; "
           "mean of %d)\n",
           spent.count() / kCalls, kCalls);
    CUDA_CHECK(cudaFree(matrix));
}
#endif  // CUDART_VERSION >= 12000
