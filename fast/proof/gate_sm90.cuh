// fast/proof/gate_sm90.cuh: the gate's checks of versions 2 to 5, the plans that need
// sm_90 (the Hopper kernels, versions 2 to 4, sm_90a's wgmma and TMA; version 5, a
// cluster's split of K). Part of gate.cu's one translation unit, included after
// checkShape and launchDirectly, which it uses; not a header of its own.
//
// CUDA 12's headers declare what these kernels need (tensor maps, clusters): with an
// older toolkit the gate checks version 1 and the launcher alone.
#if CUDART_VERSION >= 12000
// Version 5 directly, each shape also run by version 1's two launches with the same
// splits, whose bits it must give: K = 48 in two splits of one stage (the second
// half-filled); 272 (nine stages, the last half-filled) asked in 2, 4 and 8 splits,
// which become 2, 3 and 5 (no empty split); 384 in 3 and 7, which becomes 6 (a
// tile's 64 rows shared unevenly among the splits for the reduction); a K of 4096 in
// 8; the bias; FP16's edges.
template <class Plan>
bool checkSplitPlan(const char* name, std::mt19937& generator) {
    const Launcher launch = launchDirectly<5, Plan>, two_launches = launchDirectly<1, Plan>;
    constexpr int kM = 2 * Plan::kBlockM, kN = 3 * Plan::kBlockN;
    bool pass = checkShape(name, launch, 2, kM, kN, 48, generator, false, false, two_launches);
    for (int splits : {2, 4, 8})
        pass &= checkShape(name, launch, splits, kM, kN, 272, generator, false, false,
                           two_launches);
    for (int splits : {3, 7})
        pass &= checkShape(name, launch, splits, kM, kN, 384, generator, false, false,
                           two_launches);
    pass &= checkShape(name, launch, 8, kM, kN, 4096, generator, false, false, two_launches);
    pass &= checkShape(name, launch, 4, kM, kN, 272, generator, /*with_bias=*/true, false,
                       two_launches);
    pass &= checkShape(name, launch, 3, kM, kN, 384, generator, true, /*extremes=*/true,
                       two_launches);
    return pass;
}

// Each Hopper plan directly, where this device runs it: one tile and several, with M
// and N each one tile or two; every K the contract allows against the 64 of a stage
// (K = 16, a single step; 48, one part-filled stage; 272, four whole stages and 16;
// 320, five whole stages, one more than the ring holds); a K of 4096 (64 stages, so
// each mbarrier completes 16 phases); more tiles than the card has SMs (4096 x 1536:
// 192 wide tiles, 384 narrow, beside an H200's 132 SMs), so that version 2's blocks
// wait for a second wave and version 3's blocks take several tiles each, with K of
// six stages, so that its ring wraps inside a tile as well as between tiles; the
// bias, whole and with a tail; FP16's edges. Its lines name no split: the Hopper
// kernels never split K (splits 0 here: no workspace).
//
// Version 4 (tile_rows 2) takes tile rows in pairs, its clusters two blocks high (the
// launcher gives an odd number of them to version 3), so its shapes have M doubled,
// but for K = 4096, which has two tile rows for every version. 4096 x 1536 is 96
// pairs of wide tiles beside an H200's 66 clusters: some clusters take two pairs. Its
// bias is the fused op's path, whose bias goes into the staging buffers with the
// accumulators.
template <class Plan>
bool checkHopperPlan(const char* name, Launcher launch, int tile_rows, std::mt19937& generator) {
    const int m = tile_rows * Plan::kBlockM, n = Plan::kBlockN;
    bool pass = true;
    for (int k : {16, 48, 272, 320}) pass &= checkShape(name, launch, 0, m, n, k, generator);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator);
    pass &= checkShape(name, launch, 0, 2 * Plan::kBlockM, n, 4096, generator);
    pass &= checkShape(name, launch, 0, 4096, 1536, 336, generator);
    for (int k : {48, 272})
        pass &= checkShape(name, launch, 0, 2 * m, 2 * n, k, generator, /*with_bias=*/true);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator, false, /*extremes=*/true);
    pass &= checkShape(name, launch, 0, 2 * m, 2 * n, 272, generator, true, /*extremes=*/true);
    return pass;
}

// Versions 2 to 4 on both Hopper plans, where this device runs sm_90a code (version 4
// on tile rows in pairs); then version 4's clusters resident at once, and the host time
// the Hopper launcher adds to every call.
bool checkHopperPlans(const tuned::DeviceFacts& facts, std::mt19937& generator) {
    using tuned::HopperNarrowPlan, tuned::HopperWidePlan;
    bool pass = checkHopperPlan<HopperWidePlan>("HopperWidePlan", launchDirectly<2, HopperWidePlan>,
                                                1, generator);
    pass &= checkHopperPlan<HopperNarrowPlan>("HopperNarrowPlan",
                                              launchDirectly<2, HopperNarrowPlan>, 1, generator);
    pass &= checkHopperPlan<HopperWidePlan>("HopperWidePlan, persistent",
                                            launchDirectly<3, HopperWidePlan>, 1, generator);
    pass &= checkHopperPlan<HopperNarrowPlan>("HopperNarrowPlan, persistent",
                                              launchDirectly<3, HopperNarrowPlan>, 1, generator);
    pass &= checkHopperPlan<HopperWidePlan>("HopperWidePlan, cluster",
                                            launchDirectly<4, HopperWidePlan>, 2, generator);
    pass &= checkHopperPlan<HopperNarrowPlan>("HopperNarrowPlan, cluster",
                                              launchDirectly<4, HopperNarrowPlan>, 2, generator);
    printf("version 4: %d clusters of %d resident at once\n", facts.clusters,
           tuned::version4::kClusterSize);
    // What the Hopper launcher adds to every call on the host: encoding A's and B's
    // tensor maps (the lesson's first shape; the encoder's cost does not depend on it).
    // Version 4 encodes C's map as well, a third such call, not timed here.
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
    return pass;
}
#endif  // CUDART_VERSION >= 12000
