// fast/gate.cu: the fast tier's standalone gate. fast/launch_policy.cu's launcher, and
// each version's tile plans directly (whole and with K split, with and without a bias),
// against a float64 CPU reference, the backward's scaling kernel against the same
// arithmetic on the CPU, and (on a card that runs code for sm_80) the backward in one
// launch against float64, with no PyTorch anywhere: if this fails, the kernels are
// wrong, not the binding.
//
// Build and run from the lesson's folder (any card from sm_75 up; name yours):
//   nvcc -O3 -arch=sm_80 -o fast/gate fast/gate.cu && fast/gate
// On a Hopper card (H100, H200), build for sm_90a, the target that has wgmma, so that
// the Hopper kernels' plans are checked too, each plan on versions 2, 3 and 4 (the
// launcher's shapes take version 3 where it chooses a Hopper kernel; with
// DAY87_FAST_KERNEL=cluster, persistent or hopper set, they all run on that one, but
// version 4 only where M is an even number of tiles):
//   nvcc -O3 -gencode=arch=compute_90a,code=sm_90a -o fast/gate fast/gate.cu && fast/gate
// On any card from sm_90, version 5's plan is checked too, each shape against version
// 1's two launches bit for bit (DAY87_FAST_KERNEL=split runs the launcher's shapes on it).
// --backward checks the backward in one launch alone (fast/planted_bugs.py's backward part).
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
//   nvcc -O3 -arch=sm_80 -DDAY87_ORDERING_BUILD -o fast/gate_ordering fast/gate.cu &&
//     fast/gate_ordering
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

#include "launch_policy.cu"  // the five versions and the launcher that chooses
#include "scale_to_half.cu"   // the backward's scaling kernel
#include "backward_one_launch.cu"  // the backward in one launch

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
// checks the Hopper plans alone (fast/planted_bugs.py's Hopper bugs), --split
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
// fast/common.cuh's FastGemmOperands, so an operand added there changes nothing here.
using Launcher = cudaError_t (*)(const tuned::FastGemmOperands&, int splits, float* workspace,
                                 cudaStream_t);

// The launcher that fast/binding.cpp calls, with its arguments taken from the operands.
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

// Version 1's plan directly, as the launcher launches it on this device.
template <class Plan>
cudaError_t launchWmma(const tuned::FastGemmOperands& operands, int splits, float* workspace,
                       cudaStream_t stream) {
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version1::launchPlan<Plan>(operands, splits, workspace, facts.sm90_code,
                                             stream);
}

// Each plan directly, whichever one the launcher would choose on this card: K % 32 ==
// 16 (a half-filled last stage of 32), K = 16 (a single step), a K of 4096 split in
// two (a multiply long enough that a reduction launched early which did not wait for
// it would read unwritten sums), and K split two ways and four, where the splits'
// stages do not divide evenly (17 stages of 16, 9 of 32). Then the bias, which must
// be added once: whole, and with K split (the reduction adds it, not each split).
template <class Plan>
bool checkPlan(const char* name, std::mt19937& generator) {
    const Launcher launch = launchWmma<Plan>;
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

#if CUDART_VERSION >= 12000
// Version 5's plan directly, as the launcher launches it on this device.
template <class Plan>
cudaError_t launchSplit(const tuned::FastGemmOperands& operands, int splits, float*,
                        cudaStream_t stream) {
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version5::launchClusterSplitPlan<Plan>(operands, splits, facts.sm90_code,
                                                         stream);
}

// Version 5 directly, each shape also run by version 1's two launches with the same
// splits, whose bits it must give: K = 48 in two splits of one stage (the second
// half-filled); 272 (nine stages, the last half-filled) asked in 2, 4 and 8 splits,
// which become 2, 3 and 5 (no empty split); 384 in 3 and 7, which becomes 6 (a
// tile's 64 rows shared unevenly among the splits for the reduction); a K of 4096 in
// 8; the bias; FP16's edges.
template <class Plan>
bool checkSplitPlan(const char* name, std::mt19937& generator) {
    const Launcher launch = launchSplit<Plan>, two_launches = launchWmma<Plan>;
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

// A Hopper plan directly, on version 2 (a block per tile) or version 3 (persistent),
// as their launchers take it (neither splits K).
template <class Plan>
cudaError_t launchHopper(const tuned::FastGemmOperands& operands, int, float*,
                         cudaStream_t stream) {
    return tuned::version2::launchHopperPlan<Plan>(operands, stream);
}

template <class Plan>
cudaError_t launchPersistent(const tuned::FastGemmOperands& operands, int, float*,
                             cudaStream_t stream) {
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version3::launchPersistentPlan<Plan>(operands, facts.multiprocessors, stream);
}

template <class Plan>
cudaError_t launchCluster(const tuned::FastGemmOperands& operands, int, float*,
                          cudaStream_t stream) {
    tuned::DeviceFacts facts;
    const cudaError_t status = tuned::currentDeviceFacts(&facts);
    if (status != cudaSuccess) return status;
    return tuned::version4::launchClusterPlan<Plan>(operands, facts.clusters, stream);
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
template <class Plan>
bool checkHopperPlan(const char* name, Launcher launch, std::mt19937& generator) {
    constexpr int kM = Plan::kBlockM, kN = Plan::kBlockN;
    bool pass = true;
    for (int k : {16, 48, 272, 320}) pass &= checkShape(name, launch, 0, kM, kN, k, generator);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator);
    pass &= checkShape(name, launch, 0, 2 * kM, kN, 4096, generator);
    pass &= checkShape(name, launch, 0, 4096, 1536, 336, generator);
    for (int k : {48, 272})
        pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, k, generator, /*with_bias=*/true);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator, false, /*extremes=*/true);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator, true, /*extremes=*/true);
    return pass;
}

// Version 4's plans directly: checkHopperPlan's shapes with M doubled, since its
// clusters take tile rows in pairs (the launcher gives an odd number to version 3).
// 4096 x 1536 is 96 pairs of wide tiles beside an H200's 66 clusters: some clusters
// take two pairs. The bias is the fused op's path, whose bias goes into the staging
// buffers with the accumulators.
template <class Plan>
bool checkClusterPlan(const char* name, Launcher launch, std::mt19937& generator) {
    constexpr int kM = 2 * Plan::kBlockM, kN = Plan::kBlockN;
    bool pass = true;
    for (int k : {16, 48, 272, 320}) pass &= checkShape(name, launch, 0, kM, kN, k, generator);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator);
    pass &= checkShape(name, launch, 0, kM, kN, 4096, generator);
    pass &= checkShape(name, launch, 0, 4096, 1536, 336, generator);
    for (int k : {48, 272})
        pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, k, generator, /*with_bias=*/true);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator, false, /*extremes=*/true);
    pass &= checkShape(name, launch, 0, 2 * kM, 2 * kN, 272, generator, true, /*extremes=*/true);
    return pass;
}
#endif

// ---------------------------------------------------------------------------
// The backward's scaling
// ---------------------------------------------------------------------------
// launchScaleToHalf on grad (rows x cols with these strides, in a buffer of random
// values of magnitudes 1e-6 to 1, one of them the largest, -2^20 in magnitude, at
// element (largest_row, largest_col)), against the CPU's own power of two and
// roundings: every FP16 and the unscale must be bit-equal. Where rows are padded
// (row_stride > cols), the padding holds 2^22, larger than any element: a kernel
// that reads the padding as part of grad derives the wrong scale and casts the wrong
// values. The partial maxima's workspace starts as 2^100 in every float (NaN would
// not do: fmaxf drops a NaN), so a cast that reads a partial maximum before it is
// written derives a scale 2^-80 too small and casts zeros.
bool checkScale(const char* name, int rows, int cols, int64_t row_stride, int64_t col_stride,
                int largest_row, int largest_col, std::mt19937& generator) {
    if (rows > size_limit || cols > size_limit) return true;  // left out of this run
    const size_t count = static_cast<size_t>(rows) * cols;
    const size_t extent =
        (rows - 1) * row_stride + (cols - 1) * col_stride + 1;  // the buffer grad lies in
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> decades(-6.0f, 0.0f);
    // what no element overwrites is padding
    std::vector<float> buffer(extent, std::ldexp(1.0f, 22));
    auto element = [&](int row, int col) -> float& {
        return buffer[row * row_stride + col * col_stride];
    };
    for (int row = 0; row < rows; ++row)
        for (int col = 0; col < cols; ++col)
            element(row, col) = normal(generator) * std::pow(10.0f, decades(generator));
    // a negative largest: |value| is what counts
    element(largest_row, largest_col) = -std::ldexp(1.0f, 20);

    // The CPU's arithmetic, as fast/scale_to_half.cu's comment states it.
    float largest = 0.0f;
    for (int row = 0; row < rows; ++row)
        for (int col = 0; col < cols; ++col)
            largest = std::fmax(largest, std::fabs(element(row, col)));
    int exponent;
    std::frexp(largest, &exponent);
    const int biased = std::min(std::max(142 - exponent, 1), 253);
    const float scale = std::ldexp(1.0f, biased - 127), unscale = std::ldexp(1.0f, 127 - biased);

    float *device_grad, *workspace, *alpha_and_beta;
    half* device_scaled;
    CUDA_CHECK(cudaMalloc(&device_grad, extent * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&device_scaled, count * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&workspace, tuned::kMaxHelperBlocks * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&alpha_and_beta, 2 * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(device_grad, buffer.data(), extent * sizeof(float),
                          cudaMemcpyHostToDevice));
    const std::vector<float> poison(tuned::kMaxHelperBlocks, std::ldexp(1.0f, 100));
    CUDA_CHECK(cudaMemcpy(workspace, poison.data(), poison.size() * sizeof(float),
                          cudaMemcpyHostToDevice));
    // NaN: an unwritten FP16 fails
    CUDA_CHECK(cudaMemset(device_scaled, 0xFF, count * sizeof(half)));
    CUDA_CHECK(tuned::launchScaleToHalf(device_grad, rows, cols, row_stride, col_stride,
                                        device_scaled, alpha_and_beta, workspace, /*stream=*/0));
    CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<half> scaled(count);
    float factors[2];
    CUDA_CHECK(cudaMemcpy(scaled.data(), device_scaled, count * sizeof(half),
                          cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(factors, alpha_and_beta, sizeof(factors), cudaMemcpyDeviceToHost));
    for (void* pointer : {static_cast<void*>(device_grad), static_cast<void*>(device_scaled),
                          static_cast<void*>(workspace), static_cast<void*>(alpha_and_beta)})
        CUDA_CHECK(cudaFree(pointer));

    size_t wrong = 0;
    for (int row = 0; row < rows; ++row)
        for (int col = 0; col < cols; ++col) {
            const half expected = __float2half_rn(element(row, col) * scale);
            unsigned short got_bits, expected_bits;
            std::memcpy(&got_bits, &scaled[static_cast<size_t>(row) * cols + col],
                        sizeof(got_bits));
            std::memcpy(&expected_bits, &expected, sizeof(expected_bits));
            wrong += got_bits != expected_bits;
        }
    const bool pass = wrong == 0 && factors[0] == unscale && factors[1] == 0.0f;
    printf("scale: %-30s %5d x %5d   %zu of %zu FP16s differ, unscale %s   %s\n", name, rows, cols,
           wrong, count, factors[0] == unscale && factors[1] == 0.0f ? "exact" : "WRONG",
           pass ? "pass" : "FAIL");
    return pass;
}

// The backward in one launch (fast/backward_one_launch.cu): grad_a = grad @ b^T and
// grad_b = a^T @ grad against float64 from the same values, grad given by `row_stride`
// and `col_stride` in a buffer of padding (2^22: read as grad, it is far out of the
// bound). Each value within
//   2^-11 |reference|                      its rounding to FP16,
//   + (2^-11 + inner * 2^-23) magnitude    grad's rounding to TF32, the FP32 sums,
//   + 2^-25                                half of FP16's smallest subnormal,
// magnitude the same sum of |products|. The outputs start as NaN, so an unwritten one
// fails; a second launch must give the same bits.
bool checkBackward(const char* name, int m, int k, int n, int64_t row_stride, int64_t col_stride,
                   bool want_a, bool want_b, std::mt19937& generator) {
    if (m > size_limit || n > size_limit || k > size_limit) return true;  // left out of this run
    const size_t extent = (m - 1) * row_stride + (n - 1) * col_stride + 1;
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::uniform_real_distribution<float> decades(-6.0f, 1.0f);
    std::vector<float> buffer(extent, std::ldexp(1.0f, 22));
    auto grad = [&](int row, int col) -> float& {
        return buffer[row * row_stride + col * col_stride];
    };
    for (int row = 0; row < m; ++row)
        for (int col = 0; col < n; ++col)
            grad(row, col) = normal(generator) * std::pow(10.0f, decades(generator));
    std::vector<half> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
    for (auto& value : a) value = __float2half(normal(generator));
    for (auto& value : b) value = __float2half(normal(generator));

    float* device_grad;
    half *device_a, *device_b, *device_grad_a, *device_grad_b;
    const size_t count_a = static_cast<size_t>(m) * k, count_b = static_cast<size_t>(k) * n;
    CUDA_CHECK(cudaMalloc(&device_grad, extent * sizeof(float)));
    CUDA_CHECK(cudaMalloc(&device_a, count_a * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_b, count_b * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_grad_a, count_a * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_grad_b, count_b * sizeof(half)));
    CUDA_CHECK(cudaMemcpy(device_grad, buffer.data(), extent * sizeof(float),
                          cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(device_a, a.data(), count_a * sizeof(half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(device_b, b.data(), count_b * sizeof(half), cudaMemcpyHostToDevice));
    std::vector<half> got_a(count_a), got_b(count_b), again_a(count_a), again_b(count_b);
    for (int run = 0; run < 2; ++run) {
        CUDA_CHECK(cudaMemset(device_grad_a, 0xFF, count_a * sizeof(half)));
        CUDA_CHECK(cudaMemset(device_grad_b, 0xFF, count_b * sizeof(half)));
        CUDA_CHECK(tuned::launchOneLaunchBackward(
            device_grad, row_stride, col_stride, device_a, device_b,
            want_a ? device_grad_a : nullptr, want_b ? device_grad_b : nullptr, m, n, k,
            /*stream=*/0));
        CUDA_CHECK(cudaDeviceSynchronize());
        CUDA_CHECK(cudaMemcpy((run ? again_a : got_a).data(), device_grad_a,
                              count_a * sizeof(half), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy((run ? again_b : got_b).data(), device_grad_b,
                              count_b * sizeof(half), cudaMemcpyDeviceToHost));
    }
    for (void* pointer : {static_cast<void*>(device_grad), static_cast<void*>(device_a),
                          static_cast<void*>(device_b), static_cast<void*>(device_grad_a),
                          static_cast<void*>(device_grad_b)})
        CUDA_CHECK(cudaFree(pointer));

    // The worst |error| / bound of one gradient, rows x cols, each value a sum over `inner`.
    auto worst = [&](const std::vector<half>& got, int rows, int cols, int inner,
                     auto left, auto right) {
        double ratio = 0.0;
        for (int i = 0; i < rows; ++i)
            for (int j = 0; j < cols; ++j) {
                double sum = 0.0, magnitude = 0.0;
                for (int p = 0; p < inner; ++p) {
                    const double product = left(i, p) * right(p, j);
                    sum += product;
                    magnitude += std::fabs(product);
                }
                const double value = __half2float(got[static_cast<size_t>(i) * cols + j]);
                const double bound = std::ldexp(std::fabs(sum), -11) +
                                     (std::ldexp(1.0, -11) + inner * std::ldexp(1.0, -23)) *
                                         magnitude + std::ldexp(1.0, -25);
                const double error = std::fabs(value - sum);  // NaN where unwritten
                ratio = std::max(ratio, std::isnan(error) ? INFINITY : error / bound);
            }
        return ratio;
    };
    auto wide = [](half value) { return static_cast<double>(__half2float(value)); };
    const double ratio_a = !want_a ? 0.0 : worst(got_a, m, k, n,
        [&](int i, int p) { return static_cast<double>(grad(i, p)); },
        [&](int p, int j) { return wide(b[static_cast<size_t>(j) * n + p]); });
    const double ratio_b = !want_b ? 0.0 : worst(got_b, k, n, m,
        [&](int i, int p) { return wide(a[static_cast<size_t>(p) * k + i]); },
        [&](int p, int j) { return static_cast<double>(grad(p, j)); });
    const bool same_bits = (!want_a || !std::memcmp(got_a.data(), again_a.data(), count_a * 2)) &&
                           (!want_b || !std::memcmp(got_b.data(), again_b.data(), count_b * 2));
    const bool pass = ratio_a <= 1.0 && ratio_b <= 1.0 && same_bits;
    char worst_a[16] = "-", worst_b[16] = "-";  // a gradient not wanted is not checked
    if (want_a) snprintf(worst_a, sizeof(worst_a), "%.3f", ratio_a);
    if (want_b) snprintf(worst_b, sizeof(worst_b), "%.3f", ratio_b);
    printf("backward in one launch: %-22s M=%4d K=%4d N=%4d   worst |error| / bound: "
           "grad_a %s, grad_b %s; bits %s twice   %s\n",
           name, m, k, n, worst_a, worst_b, same_bits ? "the same" : "NOT THE SAME",
           pass ? "pass" : "FAIL");
    return pass;
}

// The backward in one launch's shapes (M, K, N): the lesson's first layer and the
// shape of its second forward, one tile, tiles of grad_a and grad_b in unequal counts,
// grad transposed, with padded rows (torch.cat's part) and expanded (strides 0 and 0:
// what c.sum().backward() hands over), each gradient alone.
bool checkBackwardShapes(std::mt19937& generator) {
    bool pass = checkBackward("the lesson's layer", 256, 384, 512, 512, 1, true, true, generator);
    pass &= checkBackward("the lesson's 2nd shape", 512, 128, 1024, 1024, 1, true, true, generator);
    pass &= checkBackward("one tile", 64, 64, 64, 64, 1, true, true, generator);
    pass &= checkBackward("unequal tile counts", 192, 320, 128, 128, 1, true, true, generator);
    pass &= checkBackward("odd counts of 32", 96, 160, 224, 224, 1, true, true, generator);
    pass &= checkBackward("grad transposed", 256, 128, 192, 1, 256, true, true, generator);
    pass &= checkBackward("grad's rows padded", 128, 192, 256, 300, 1, true, true, generator);
    pass &= checkBackward("grad expanded (sum's)", 128, 192, 256, 0, 0, true, true, generator);
    pass &= checkBackward("grad_a alone", 128, 192, 256, 256, 1, true, false, generator);
    pass &= checkBackward("grad_b alone", 128, 192, 256, 256, 1, false, true, generator);
    return pass;
}

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
    if (facts.hopper && !split_only) {
        all_pass &= checkHopperPlan<tuned::HopperWidePlan>(
            "HopperWidePlan", launchHopper<tuned::HopperWidePlan>, generator);
        all_pass &= checkHopperPlan<tuned::HopperNarrowPlan>(
            "HopperNarrowPlan", launchHopper<tuned::HopperNarrowPlan>, generator);
        all_pass &= checkHopperPlan<tuned::HopperWidePlan>(
            "HopperWidePlan, persistent", launchPersistent<tuned::HopperWidePlan>, generator);
        all_pass &= checkHopperPlan<tuned::HopperNarrowPlan>(
            "HopperNarrowPlan, persistent", launchPersistent<tuned::HopperNarrowPlan>, generator);
        all_pass &= checkClusterPlan<tuned::HopperWidePlan>(
            "HopperWidePlan, cluster", launchCluster<tuned::HopperWidePlan>, generator);
        all_pass &= checkClusterPlan<tuned::HopperNarrowPlan>(
            "HopperNarrowPlan, cluster", launchCluster<tuned::HopperNarrowPlan>, generator);
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
    }
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

    // The backward's scaling: held in registers (with the largest first), a count that
    // is not a multiple of 4 (and the largest last), held in registers and shared
    // memory with the rest read twice (a 64 MB grad; the largest in the last float4),
    // a transposed view, walked element by element, and rows padded to a longer row
    // stride: the gradient that torch.cat([c1, c2], dim=1) hands c1, 200 of every 256
    // floats, which is row-major and 16-byte aligned and still not one dense run.
    all_pass &= checkScale("registers", 256, 512, 512, 1, 0, 0, generator);
    all_pass &= checkScale("count % 4 == 3", 129, 131, 131, 1, 128, 130, generator);
    all_pass &= checkScale("shared memory, read twice", 4096, 4096, 4096, 1, 4095, 4094, generator);
    all_pass &= checkScale("transposed view", 300, 200, 1, 300, 45, 41, generator);
    all_pass &= checkScale("padded rows (torch.cat's part)", 300, 200, 256, 1, 299, 199, generator);
    if (backward_runs)
        all_pass &= checkBackwardShapes(generator);
    else
        printf("backward in one launch: not run, this device runs no code for sm_80 or newer\n");

    printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
    return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
}
