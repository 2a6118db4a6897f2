// fast/proof/gate.cu: the fast tier's standalone gate. fast/csrc/launch_policy.cu's launcher,
// and each version's tile plans directly (whole and with K split, with and without a
// bias), against a float64 CPU reference, the backward's scaling kernel against the same
// arithmetic on the CPU, and (on a card that runs code for sm_80) the backward in one
// launch against float64, with no PyTorch anywhere: if this fails, the kernels are
// wrong, not the binding.
//
// One translation unit in three files: this one (the forward's checks of version 1 and
// the launcher, and main), gate_sm90.cuh (versions 2 to 5: the plans that need sm_90)
// and gate_backward.cuh (the backward's two versions), which it includes; nvcc builds
// it from this file alone.
//
// Build and run from fast/ (any card from sm_75 up; name yours):
//   nvcc -O3 -arch=sm_80 -o gate proof/gate.cu && ./gate
// On a Hopper card (H100, H200), build for sm_90a, the target that has wgmma, so that
// the Hopper kernels' plans are checked too, each plan on versions 2, 3 and 4 (the
// launcher's shapes take version 3 where it chooses a Hopper kernel; with
// DAY87_FAST_KERNEL=cluster, persistent or hopper set, they all run on that one, but
// version 4 only where M is an even number of tiles):
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o gate proof/gate.cu && ./gate
// On any card from sm_90, version 5's plan is checked too, each shape against version
// 1's two launches bit for bit (DAY87_FAST_KERNEL=split runs the launcher's shapes on it).
// --backward checks the backward in one launch alone (proof/planted_bugs.py's backward
// part).
//
// The ordering build adds -DDAY87_ORDERING_BUILD: every split of K then holds for
// 200,000 SM cycles before it writes its partial sums (long beside the multiply
// itself), and the workspace starts as NaN as always, so a split-K reduction that
// reads before it waits reads NaN on every split shape, not only where the multiply
// happens to be slow (in version 5, every split but the first, so that a block that
// reads the others' partial tiles before the cluster's barrier reads them unwritten).
// The scaling kernel's block 0 holds as long before it writes its
// largest magnitude, so a cast that does not wait at the grid's barrier reads that
// block's poison. The Hopper kernels' stages start as NaN, their producer holds as
// long before it first fills each stage, and each consumer a tenth of that before it
// multiplies a stage:
//   nvcc -O3 -arch=sm_80 -DDAY87_ORDERING_BUILD -o gate_ordering proof/gate.cu &&
//     ./gate_ordering
//
// It exits 0 when every shape is within its error bound, and 1 on a mismatch, on any
// CUDA error, or where there is no CUDA device to run on. Exiting is right here, in a
// program of its own, so it checks each CUDA call with day 5's CUDA_CHECK (defined
// below); the extension never does, because an operator must raise, not exit.

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

// The kernels call these where a split writes its partial sums and where a block of
// the scaling kernel writes its largest magnitude; they must be defined before the
// kernels' files are included.
#ifdef DAY87_ORDERING_BUILD
#include <cuda_runtime.h>
__device__ void holdLong() {
    const long long start = clock64();
    while (clock64() - start < 200000) __nanosleep(1000);
}
#define DAY87_HOLD_PARTIAL_SUMS() holdLong()
#define DAY87_HOLD_PARTIAL_MAXIMA()                \
    do {                                           \
        if (blockIdx.x == 0) holdLong(); \
    } while (0)
// The Hopper kernels' pipeline: its stages start as NaN (0xFFFF halves), written by
// every thread and made visible to TMA and wgmma (the async proxy) before the
// barriers' __syncthreads; the producer holds 200,000 cycles (holdLong) before each
// stage's first fill, and each consumer 20,000 (holdBriefly: a tenth, and still many
// times a TMA copy's latency) before it multiplies a stage.
__device__ void holdBriefly() {
    const long long start = clock64();
    while (clock64() - start < 20000) __nanosleep(100);
}
#define DAY87_POISON_HOPPER_STAGES(stages, bytes)                                          \
    do {                                                                                   \
        for (int i = threadIdx.x; i < (bytes) / 16; i += blockDim.x)                       \
            reinterpret_cast<uint4*>(stages)[i] = make_uint4(~0u, ~0u, ~0u, ~0u);          \
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");                     \
    } while (0)
#define DAY87_HOLD_HOPPER_PRODUCER(first_fill) \
    do {                                       \
        if (first_fill) holdLong();  \
    } while (0)
#define DAY87_HOLD_HOPPER_CONSUMER() holdBriefly()
#endif

#include "../csrc/launch_policy.cu"  // the five versions and the launcher that chooses
#include "../csrc/backward_version1_scaled.cu"  // the backward's scaling kernel
#include "../csrc/backward_version2_one_launch.cu"  // the backward in one launch

// Day 5's CUDA_CHECK: a failed call prints where it failed and ends the program.
#define CUDA_CHECK(call)                                                                 \
    do {                                                                                 \
        cudaError_t err = (call);                                                        \
        if (err != cudaSuccess) {                                                        \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err), __FILE__, \
                    __LINE__);                                                           \
            exit(EXIT_FAILURE);                                                          \
        }                                                                                \
    } while (0)

// What a run checks, from main's arguments: --small leaves out every shape with a
// dimension past 512 (compute-sanitizer runs a kernel many times slower), --hopper
// checks the Hopper plans alone (proof/planted_bugs.py's Hopper bugs), --split
// version 5's plan alone (its split bugs), and --backward the backward in one launch
// alone (its bugs).
int size_limit = INT_MAX;
bool hopper_only = false;
bool split_only = false;
bool backward_only = false;

// ---------------------------------------------------------------------------
// CPU reference
// ---------------------------------------------------------------------------
// reference = A @ B in float64 from the same FP16 values the kernel reads, and
// magnitude = |A| @ |B|, the scale of the error bound below.
void referenceGemm(const std::vector<half>& a, const std::vector<half>& b,
                   std::vector<double>& reference, std::vector<double>& magnitude, int m, int n,
                   int k) {
    std::vector<double> a_wide(a.size()), b_wide(b.size());
    for (size_t i = 0; i < a.size(); ++i) a_wide[i] = __half2float(a[i]);
    for (size_t i = 0; i < b.size(); ++i) b_wide[i] = __half2float(b[i]);
    for (int i = 0; i < m; ++i) {
        double* row = &reference[static_cast<size_t>(i) * n];
        double* row_magnitude = &magnitude[static_cast<size_t>(i) * n];
        for (int j = 0; j < n; ++j) row[j] = row_magnitude[j] = 0.0;
        for (int p = 0; p < k; ++p) {
            const double left = a_wide[static_cast<size_t>(i) * k + p];
            const double* b_row = &b_wide[static_cast<size_t>(p) * n];
            for (int j = 0; j < n; ++j) {
                row[j] += left * b_row[j];
                row_magnitude[j] += std::fabs(left * b_row[j]);
            }
        }
    }
}

// ---------------------------------------------------------------------------
// One shape through one launch
// ---------------------------------------------------------------------------
// How a check launches: a plan directly, K in `splits` runs (0 for a Hopper plan,
// which never splits K), or the launcher, which chooses both. The operands travel as
// fast/csrc/common.cuh's FastGemmOperands, so an operand added there changes nothing
// here.
using Launcher = cudaError_t (*)(const tuned::FastGemmOperands&, int splits, float* workspace,
                                 cudaStream_t);

// The launcher that fast/csrc/binding.cpp calls, with its arguments taken from the
// operands.
cudaError_t launchChosen(const tuned::FastGemmOperands& operands, int, float* workspace,
                         cudaStream_t stream) {
    return tuned::launchFastGemm(operands.a, operands.b, operands.bias, operands.c, operands.m,
                                 operands.n, operands.k, workspace, stream);
}

// The bound is test_op.py's, derived there (reference_and_bound): K * 2^-23 * (|A| @ |B|), and
// with a bias (K + 1) * 2^-23 * (|A| @ |B| + |bias|): one more FP32 addition.
//
// `extremes` draws a and b from FP16's edges as well as from N(0, 1): the largest
// finite value (65504), the smallest normal (2^-14) and the smallest subnormal
// (2^-24), each of either sign. Every shape is multiplied twice into a poisoned C,
// and the two results must have the same bits; with `same_bits_as`, a third time by
// that launcher, which must give those bits too.
bool checkShape(const char* launcher_name, Launcher launch, int splits, int m, int n, int k,
                std::mt19937& generator, bool with_bias = false, bool extremes = false,
                Launcher same_bits_as = nullptr) {
    if (m > size_limit || n > size_limit || k > size_limit) return true;  // left out of this run
    std::normal_distribution<float> normal(0.0f, 1.0f);
    const float edges[] = {65504.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24)};
    std::uniform_int_distribution<int> pick(0, 7);  // 0-2: an edge, 3-7: a normal draw
    auto draw = [&]() {
        const int choice = extremes ? pick(generator) : 7;
        const float value = choice < 3 ? edges[choice] : normal(generator);
        return __float2half(choice < 3 && normal(generator) < 0.0f ? -value : value);
    };
    std::vector<half> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
    for (auto& value : a) value = draw();
    for (auto& value : b) value = draw();
    std::vector<float> bias(with_bias ? n : 0);
    for (auto& value : bias) value = normal(generator);

    half *device_a, *device_b;
    float *device_c, *device_bias = nullptr, *workspace = nullptr;
    const size_t workspace_bytes =
        launch == launchChosen ? tuned::fastGemmWorkspaceBytes(m, n, k)
                               : splits * static_cast<size_t>(m) * n * sizeof(float);
    CUDA_CHECK(cudaMalloc(&device_a, a.size() * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_b, b.size() * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_c, static_cast<size_t>(m) * n * sizeof(float)));
    if (with_bias) {
        CUDA_CHECK(cudaMalloc(&device_bias, bias.size() * sizeof(float)));
        CUDA_CHECK(cudaMemcpy(device_bias, bias.data(), bias.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
    }
    if (workspace_bytes) CUDA_CHECK(cudaMalloc(&workspace, workspace_bytes));
    // And the workspace: a partial sum read before it was written is NaN.
    if (workspace_bytes) CUDA_CHECK(cudaMemset(workspace, 0xFF, workspace_bytes));
    CUDA_CHECK(cudaMemcpy(device_a, a.data(), a.size() * sizeof(half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(device_b, b.data(), b.size() * sizeof(half), cudaMemcpyHostToDevice));
    // Poison C with NaN bytes (0xFF): an element the kernel never writes fails.
    CUDA_CHECK(cudaMemset(device_c, 0xFF, static_cast<size_t>(m) * n * sizeof(float)));

    tuned::FastGemmOperands operands{};
    operands.a = device_a;
    operands.b = device_b;
    operands.c = device_c;
    operands.m = m;
    operands.n = n;
    operands.k = k;
    operands.bias = device_bias;
    std::vector<float> c(static_cast<size_t>(m) * n), again(c.size()), other(c.size());
    for (std::vector<float>* result : {&c, &again, &other}) {
        if (result == &other && same_bits_as == nullptr) break;
        CUDA_CHECK(cudaMemset(device_c, 0xFF, c.size() * sizeof(float)));
        CUDA_CHECK((result == &other ? same_bits_as : launch)(operands, splits, workspace,
                                                               /*stream=*/0));
        CUDA_CHECK(cudaDeviceSynchronize());  // a program of its own may wait; an operator may not
        CUDA_CHECK(cudaMemcpy(result->data(), device_c, c.size() * sizeof(float),
                              cudaMemcpyDeviceToHost));
    }
    const bool same_bits =
        std::memcmp(c.data(), again.data(), c.size() * sizeof(float)) == 0 &&
        (same_bits_as == nullptr ||
         std::memcmp(c.data(), other.data(), c.size() * sizeof(float)) == 0);
    CUDA_CHECK(cudaFree(device_a));
    CUDA_CHECK(cudaFree(device_b));
    CUDA_CHECK(cudaFree(device_c));
    if (device_bias) CUDA_CHECK(cudaFree(device_bias));
    if (workspace) CUDA_CHECK(cudaFree(workspace));

    std::vector<double> reference(c.size()), magnitude(c.size());
    referenceGemm(a, b, reference, magnitude, m, n, k);
    for (size_t i = 0; with_bias && i < c.size(); ++i) {
        reference[i] += bias[i % n];
        magnitude[i] += std::fabs(bias[i % n]);
    }
    double worst = 0.0;  // the largest |error| / bound over all elements
    bool finite = true;
    for (size_t i = 0; i < c.size(); ++i) {
        if (!std::isfinite(c[i])) finite = false;
        const double bound = (k + with_bias) * std::ldexp(1.0, -23) * magnitude[i];
        worst = std::fmax(worst, std::fabs(c[i] - reference[i]) / bound);
    }
    const bool pass = finite && worst <= 1.0 && same_bits;
    char name[64];
    if (launch == launchChosen || splits == 0)
        snprintf(name, sizeof(name), "%s%s%s", launcher_name, with_bias ? ", bias" : "",
                 extremes ? ", FP16 edges" : "");
    else
        snprintf(name, sizeof(name), "%s, %d split(s)%s%s", launcher_name, splits,
                 with_bias ? ", bias" : "", extremes ? ", FP16 edges" : "");
    printf("%-48s %5d x %5d x %5d   %6.2f%% of bound   %s\n", name, m, n, k, 100.0 * worst,
           !finite      ? "FAIL (NaN or unwritten output)"
           : !same_bits && same_bits_as ? "FAIL (a second run, or the other launcher, other bits)"
           : !same_bits ? "FAIL (a second run gave other bits)"
           : pass       ? "pass"
                        : "FAIL");
    return pass;
}

// A plan launched directly, by its version (1 to 5), as the launcher launches it on this
// device: with what the launcher reads from the device first (whether it runs sm_90
// code, its SMs, its clusters: asked once per device, then remembered). Versions 2 to
// 4 never split K (their checks pass 0 splits and no workspace); version 5 splits K
// within a cluster, with no workspace.
template <int kVersion, class Plan>
cudaError_t launchDirectly(const tuned::FastGemmOperands& operands, int splits, float* workspace,
                           cudaStream_t stream) {
    static_assert(kVersion >= 1 && kVersion <= 5, "the fast tier has versions 1 to 5");
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    if constexpr (kVersion == 1)
        return tuned::version1::launchPlan<Plan>(operands, splits, workspace, facts.sm90_code,
                                                 stream);
#if CUDART_VERSION >= 12000  // versions 2 to 5
    else if constexpr (kVersion == 2)
        return tuned::version2::launchHopperPlan<Plan>(operands, stream);
    else if constexpr (kVersion == 3)
        return tuned::version3::launchPersistentPlan<Plan>(operands, facts.multiprocessors,
                                                           stream);
    else if constexpr (kVersion == 4)
        return tuned::version4::launchClusterPlan<Plan>(operands, facts.clusters, stream);
    else
        return tuned::version5::launchClusterSplitPlan<Plan>(operands, splits, facts.sm90_code,
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

#include "gate_sm90.cuh"      // versions 2 to 5: checkSplitPlan, checkHopperPlans
#include "gate_backward.cuh"  // the backward's versions: checkScaleShapes, checkBackwardShapes

// A machine with no GPU, or no driver, is said to be one, as the lesson's gate.cu
// says it: the runtime's own message there sends a reader looking for the wrong fix.
void requireDevice() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess && count > 0) return;
    fprintf(stderr, "gate: no CUDA device to run on (%s); the gate needs a GPU of sm_75 or newer\n",
            status == cudaSuccess ? "the driver sees none" : cudaGetErrorString(status));
    exit(EXIT_FAILURE);
}

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (!std::strcmp(argv[i], "--small")) {
            size_limit = 512;
        } else if (!std::strcmp(argv[i], "--hopper") && !split_only && !backward_only) {
            hopper_only = true;
        } else if (!std::strcmp(argv[i], "--split") && !hopper_only && !backward_only) {
            split_only = true;
        } else if (!std::strcmp(argv[i], "--backward") && !hopper_only && !split_only) {
            backward_only = true;
        } else {
            fprintf(stderr, "usage: %s [--small] [--hopper | --split | --backward]\n", argv[0]);
            return EXIT_FAILURE;
        }
    }
    requireDevice();
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
    printf("gate: %s, sm_%d%d, %d SMs%s%s%s%s%s\n", properties.name, properties.major,
           properties.minor, properties.multiProcessorCount, build,
           size_limit < INT_MAX ? ", shapes up to 512 only" : "",
           hopper_only ? ", the Hopper plans only" : "", split_only ? ", version 5 only" : "",
           backward_only ? ", the backward in one launch only" : "");
    std::mt19937 generator(87);
    bool all_pass = true;
    bool backward_runs;
    CUDA_CHECK(tuned::oneLaunchBackwardRuns(&backward_runs));
    if (backward_only) {
        all_pass = backward_runs && checkBackwardShapes(generator);  // nothing checked is no pass
        if (!backward_runs) printf("backward in one launch: this device runs no sm_80 code\n");
        printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
        return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
    }
    if (!hopper_only && !split_only) {
        all_pass &= checkPlan<tuned::version1::SquarePlan>("SquarePlan", generator);
        all_pass &= checkPlan<tuned::version1::SmallGridPlan>("SmallGridPlan", generator);
        all_pass &= checkPlan<tuned::version1::TuringPlan>("TuringPlan", generator);
    }
    tuned::DeviceFacts facts;
    CUDA_CHECK(tuned::currentDeviceFacts(&facts));
#if CUDART_VERSION >= 12000
    if (!hopper_only && facts.sm90_code)
        all_pass &= checkSplitPlan<tuned::version1::SmallGridPlan>("SmallGridPlan in clusters",
                                                                   generator);
    if (facts.hopper && !split_only) all_pass &= checkHopperPlans(facts, generator);
#endif
    if (!facts.hopper && !split_only)
        printf("Hopper plans: not run, this device runs no sm_90a code (a card of capability "
               "9.0 and -gencode=arch=compute_90a,code=sm_90a run them)\n");
    if (!facts.sm90_code)
        printf("version 5: not run, this device runs no code for sm_90 or newer\n");

    if (hopper_only || split_only) {
        all_pass &= hopper_only ? facts.hopper : facts.sm90_code;  // nothing checked is no pass
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
            : choice.plan == tuned::PlanChoice::kHopperWide       ? "HopperWide"
            : choice.plan == tuned::PlanChoice::kHopperNarrow     ? "HopperNarrow"
            : choice.plan == tuned::PlanChoice::kPersistentWide   ? "HopperWide, persistent"
            : choice.plan == tuned::PlanChoice::kPersistentNarrow ? "HopperNarrow, persistent"
            : choice.plan == tuned::PlanChoice::kClusterWide      ? "HopperWide, cluster"
            : choice.plan == tuned::PlanChoice::kClusterNarrow    ? "HopperNarrow, cluster"
            : choice.plan == tuned::PlanChoice::kSplitInCluster   ? "SmallGrid in clusters"
                                                                  : "Square";
        const bool hopper = choice.plan != tuned::PlanChoice::kTuring &&
                            choice.plan != tuned::PlanChoice::kSmallGrid &&
                            choice.plan != tuned::PlanChoice::kSplitInCluster &&
                            choice.plan != tuned::PlanChoice::kSquare;
        if (hopper)  // the Hopper kernels never split K
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
    if (backward_runs)
        all_pass &= checkBackwardShapes(generator);
    else
        printf("backward in one launch: not run, this device runs no code for sm_80 or newer\n");

    printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
    return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
}