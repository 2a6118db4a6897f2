// fast/proof/gate_check.cuh: what fast/proof/gate.cu and the studies' drivers
// (fast/studies/) share, so that a study is checked as the package's kernels are: the
// ordering build's holds, the package's launcher (fast/csrc/launch_policy.cu: versions 1
// and 3), day 5's CUDA_CHECK, the float64 CPU reference and test_op.py's bound, and
// checkShape, which runs one shape through one launch against them. A program includes
// this first, before any kernel of its own, so that its ordering build holds those too.
//
// The ordering build (-DDAY87_ORDERING_BUILD) makes a missing wait fail on every run, not
// only where a kernel happens to be slow: every split of K then holds for 200,000 SM
// cycles before it writes its partial sums (long beside the multiply itself), and the
// workspace starts as NaN as always, so a split-K reduction that reads before it waits
// reads NaN on every split shape. The scaling kernel's block 0 holds as long before it
// writes its largest magnitude, so a cast that does not wait at the grid's barrier reads
// that block's poison. The Hopper kernels' stages start as NaN, their producer holds as
// long before it first fills each stage, and each consumer a tenth of that before it
// multiplies a stage.
//
// A program that includes it exits 1 on any failed CUDA call (CUDA_CHECK): exiting is
// right in a program of its own; the extension never does, because an operator must
// raise, not exit.

#pragma once

#include <algorithm>
#include <climits>
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
// The Hopper pipeline (version 3's, and version 2's in its study): its stages start as
// NaN (0xFFFF halves), written by every thread and made visible to TMA and wgmma (the
// async proxy) before the barriers' __syncthreads; the producer holds 200,000 cycles
// (holdLong) before each stage's first fill, and each consumer 20,000 (holdBriefly: a
// tenth, and still many times a TMA copy's latency) before it multiplies a stage.
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

#include "../csrc/launch_policy.cu"  // versions 1 and 3 and the launcher that chooses

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

// A check leaves out every shape with a dimension past this (a program's --small sets
// 512: compute-sanitizer runs a kernel many times slower).
int size_limit = INT_MAX;

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
// and the two results must have the same bits.
bool checkShape(const char* launcher_name, Launcher launch, int splits, int m, int n, int k,
                std::mt19937& generator, bool with_bias = false, bool extremes = false) {
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
    std::vector<float> c(static_cast<size_t>(m) * n), again(c.size());
    for (std::vector<float>* result : {&c, &again}) {
        CUDA_CHECK(cudaMemset(device_c, 0xFF, c.size() * sizeof(float)));
        CUDA_CHECK(launch(operands, splits, workspace, /*stream=*/0));
        CUDA_CHECK(cudaDeviceSynchronize());  // a program of its own may wait; an operator may not
        CUDA_CHECK(cudaMemcpy(result->data(), device_c, c.size() * sizeof(float),
                              cudaMemcpyDeviceToHost));
    }
    const bool same_bits = std::memcmp(c.data(), again.data(), c.size() * sizeof(float)) == 0;
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
           : !same_bits ? "FAIL (a second run gave other bits)"
           : pass       ? "pass"
                        : "FAIL");
    return pass;
}

// A machine with no GPU, or no driver, is said to be one, as the lesson's gate.cu
// says it: the runtime's own message there sends a reader looking for the wrong fix.
// `program` names the program that needs `card`.
void requireDevice(const char* program, const char* card) {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess && count > 0) return;
    fprintf(stderr, "%s: no CUDA device to run on (%s); it needs %s\n", program,
            status == cudaSuccess ? "the driver sees none" : cudaGetErrorString(status), card);
    exit(EXIT_FAILURE);
}
