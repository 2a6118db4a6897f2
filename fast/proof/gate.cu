// fast/proof/gate.cu: the fast tier's standalone gate. fast/csrc/launch_policy.cu's launcher,
// and each version's tile plans directly (whole and with K split, with and without a
// bias), against a float64 CPU reference, and the backward's scaling kernel against the
// same arithmetic on the CPU, with no PyTorch anywhere: if this fails, the kernels are
// wrong, not the binding.
//
// One translation unit in four files: this one (the forward's checks of version 1 and
// the launcher, and main), which includes gate_check.cuh (the ordering build's holds,
// the reference, checkShape: what the studies' drivers share), gate_sm90.cuh (the
// Hopper plans' shapes, for version 3) and gate_backward.cuh (the backward's scaling);
// nvcc builds it from this file alone. Version 2, a study, has a driver of its own
// (fast/studies/version2_hopper.cu), which checks it at the same Hopper shapes.
//
// Build and run from fast/ (any card from sm_75 up; name yours):
//   nvcc -O3 -arch=sm_80 -o gate proof/gate.cu && ./gate
// On a Hopper card (H100, H200), build for sm_90a, the target that has wgmma, so that
// version 3's plans are checked too (the launcher's shapes take version 3 where it
// chooses it; with DAY87_FAST_KERNEL=persistent set, wherever K > 0):
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o gate proof/gate.cu && ./gate
// --hopper checks the Hopper plans alone (proof/planted_bugs.py's Hopper part); --small
// leaves out every shape with a dimension past 512 (for compute-sanitizer).
//
// The ordering build adds -DDAY87_ORDERING_BUILD (gate_check.cuh says what it holds
// back), so that a missing wait reads NaN, reads poison or hangs on every run:
//   nvcc -O3 -arch=sm_80 -DDAY87_ORDERING_BUILD -o gate_ordering proof/gate.cu &&
//     ./gate_ordering
//
// It exits 0 when every shape is within its error bound, and 1 on a mismatch, on any
// CUDA error, or where there is no CUDA device to run on.

#include "gate_check.cuh"  // first: the ordering build's holds, then versions 1 and 3
#include "../csrc/backward_version1_scaled.cu"  // the backward's scaling kernel

// What a run checks, from main's arguments: --small sets gate_check.cuh's size_limit,
// and --hopper checks the Hopper plans alone (proof/planted_bugs.py's Hopper bugs).
bool hopper_only = false;

// A plan launched directly, by its version (1 or 3), as the launcher launches it on this
// device: with what the launcher reads from the device first (whether it runs sm_90
// code, its SMs: asked once per device, then remembered). Version 3 never splits K (its
// checks pass 0 splits and no workspace).
template <int kVersion, class Plan>
cudaError_t launchDirectly(const tuned::FastGemmOperands& operands, int splits, float* workspace,
                           cudaStream_t stream) {
    static_assert(kVersion == 1 || kVersion == 3, "the package holds versions 1 and 3");
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    if constexpr (kVersion == 1)
        return tuned::version1::launchPlan<Plan>(operands, splits, workspace, facts.sm90_code,
                                                 stream);
#if CUDART_VERSION >= 12000
    else
        return tuned::version3::launchPersistentPlan<Plan>(operands, facts.multiprocessors,
                                                           stream);
#endif
}

// Each plan directly, whichever one the launcher would choose on this card: K % 32 ==
// 16 (a half-filled last stage of 32), K = 16 (a single step), a K of 4096 split in
// two (a multiply long enough that a reduction launched early which did not wait for
// it would read unwritten sums), and K split two ways and four, where the splits'
// stages do not divide evenly (17 stages of 16, 9 of 32). Then the bias, which must
// be added once: whole, and with K split (the reduction adds it, not each split).
template <class Plan>
bool checkPlan(const char* name, std::mt19937& generator) {
    const Launcher launch = launchDirectly<1, Plan>;
    bool pass = checkShape(name, launch, 1, 2 * Plan::kBlockM, 3 * Plan::kBlockN, 272, generator);
    pass &= checkShape(name, launch, 1, 3 * Plan::kBlockM, Plan::kBlockN, 16, generator);
    pass &= checkShape(name, launch, 2, 2 * Plan::kBlockM, 3 * Plan::kBlockN, 4096, generator);
    for (int splits : {2, 4})
        pass &= checkShape(name, launch, splits, 2 * Plan::kBlockM, 3 * Plan::kBlockN, 272,
                           generator);
    for (int splits : {1, 2})
        pass &= checkShape(name, launch, splits, 2 * Plan::kBlockM, 3 * Plan::kBlockN, 272,
                           generator, /*with_bias=*/true);
    return pass;
}

#include "gate_sm90.cuh"      // the Hopper plans' shapes: checkHopperPlan
#include "gate_backward.cuh"  // the backward's scaling: checkScaleShapes

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--small")) {
            size_limit = 512;
        } else if (!std::strcmp(argv[i], "--hopper")) {
            hopper_only = true;
        } else {
            fprintf(stderr, "usage: %s [--small] [--hopper]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    requireDevice("gate", "a GPU of sm_75 or newer");
    int device;
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
#ifdef DAY87_ORDERING_BUILD
    const char* build =
        ", ordering build (results held before they are written, Hopper stages poisoned)";
#else
    const char* build = "";
#endif
    printf("gate: %s, sm_%d%d, %d SMs%s%s%s\n", properties.name, properties.major,
           properties.minor, properties.multiProcessorCount, build,
           size_limit < INT_MAX ? ", shapes up to 512 only" : "",
           hopper_only ? ", the Hopper plans only" : "");
    std::mt19937 generator(87);
    bool all_pass = true;
    if (!hopper_only) {
        all_pass &= checkPlan<tuned::version1::SquarePlan>("SquarePlan", generator);
        all_pass &= checkPlan<tuned::version1::SmallGridPlan>("SmallGridPlan", generator);
        all_pass &= checkPlan<tuned::version1::TuringPlan>("TuringPlan", generator);
    }
    tuned::DeviceFacts facts;
    CUDA_CHECK(tuned::currentDeviceFacts(&facts));
#if CUDART_VERSION >= 12000
    if (facts.hopper) {  // version 3 on both Hopper plans
        using tuned::HopperNarrowPlan, tuned::HopperWidePlan;
        all_pass &= checkHopperPlan<HopperWidePlan>(
            "HopperWidePlan, persistent", launchDirectly<3, HopperWidePlan>, generator);
        all_pass &= checkHopperPlan<HopperNarrowPlan>(
            "HopperNarrowPlan, persistent", launchDirectly<3, HopperNarrowPlan>, generator);
        printTensorMapCost();
    }
#endif
    if (!facts.hopper)
        printf("Hopper plans: not run, this device runs no sm_90a code (a card of capability "
               "9.0 and -gencode=arch=compute_90a,code=sm_90a run them)\n");
    if (hopper_only) {
        all_pass &= facts.hopper;  // nothing checked is no pass
        printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
        return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
    }

    // Through the launcher, without and with a bias: the lesson's two shapes, a K that
    // leaves a half-filled last stage, a single tile, a shape with several tile groups,
    // one split ten ways on a large card and one too large to split, and K = 0 (C is
    // the bias, or zeros, whichever kernel DAY87_FAST_KERNEL forces). Each line says
    // what the launcher chose.
    const int shapes[][3] = {{256, 512, 384}, {512, 1024, 128}, {128, 256, 48}, {128, 128, 16},
                             {1280, 384, 272}, {128, 256, 640}, {1024, 1024, 1024},
                             {2048, 2048, 256}, {4096, 2048, 128}, {256, 512, 0}};
    for (const auto& shape : shapes) {
        tuned::LaunchChoice choice;
        CUDA_CHECK(tuned::chooseLaunch(shape[0], shape[1], shape[2], &choice));
        char name[64];
        const char* plan =
            choice.plan == tuned::PlanChoice::kTuring             ? "Turing"
            : choice.plan == tuned::PlanChoice::kSmallGrid        ? "SmallGrid"
            : choice.plan == tuned::PlanChoice::kPersistentWide   ? "HopperWide, persistent"
            : choice.plan == tuned::PlanChoice::kPersistentNarrow ? "HopperNarrow, persistent"
                                                                  : "Square";
        const bool hopper = choice.plan == tuned::PlanChoice::kPersistentWide ||
                            choice.plan == tuned::PlanChoice::kPersistentNarrow;
        if (hopper)  // the Hopper kernel never splits K
            snprintf(name, sizeof(name), "launcher: %s", plan);
        else
            snprintf(name, sizeof(name), "launcher: %s, %d split(s)", plan, choice.splits);
        for (bool with_bias : {false, true})
            all_pass &= checkShape(name, launchChosen, 0, shape[0], shape[1], shape[2], generator,
                                   with_bias);
    }

    // The launcher must refuse a shape the tile does not divide, not run it.
    const bool refused = tuned::launchFastGemm(nullptr, nullptr, nullptr, nullptr, 100, 128, 16,
                                               nullptr, 0) == cudaErrorInvalidValue;
    printf("launcher refuses M=100: %s\n", refused ? "pass" : "FAIL");
    all_pass &= refused;
    CUDA_CHECK(cudaGetLastError());

    all_pass &= checkScaleShapes(generator);

    printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
    return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
}
