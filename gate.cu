// gate.cu: the standalone gate. kernel.cu's launcher against a float64 CPU
// reference, with no PyTorch anywhere: if this fails, the kernel is wrong, not
// the binding.
//
// Build and run (any card from sm_75 up; name yours):
//   nvcc -O3 -arch=sm_75 -o gate gate.cu && ./gate
//
// It exits 0 when every shape is within its error bound, and 1 on a mismatch, on
// any CUDA error, or where there is no CUDA device to run on.

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <vector>

#include "kernel.cu"

// Day 5's CUDA_CHECK, byte for byte. Exiting is right here, in a program of its own;
// kernel.cu has no such macro, because the extension must never exit: std::exit would
// stop the Python interpreter without a traceback, so the launcher returns the status
// and binding.cpp raises.
#define CUDA_CHECK(call)                                                                 \
    do {                                                                                 \
        cudaError_t err = (call);                                                        \
        if (err != cudaSuccess) {                                                        \
            fprintf(stderr, "CUDA error %s at %s:%d\n", cudaGetErrorString(err), __FILE__, \
                    __LINE__);                                                           \
            exit(EXIT_FAILURE);                                                          \
        }                                                                                \
    } while (0)

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
// One shape through the kernel
// ---------------------------------------------------------------------------
// The bound is test_op.py's, derived there (reference_and_bound): K * 2^-23 * (|A| @ |B|).
bool checkShape(int m, int n, int k, std::mt19937& generator) {
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<half> a(static_cast<size_t>(m) * k), b(static_cast<size_t>(k) * n);
    for (auto& value : a) value = __float2half(normal(generator));
    for (auto& value : b) value = __float2half(normal(generator));

    half *device_a, *device_b;
    float* device_c;
    CUDA_CHECK(cudaMalloc(&device_a, a.size() * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_b, b.size() * sizeof(half)));
    CUDA_CHECK(cudaMalloc(&device_c, static_cast<size_t>(m) * n * sizeof(float)));
    CUDA_CHECK(cudaMemcpy(device_a, a.data(), a.size() * sizeof(half), cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(device_b, b.data(), b.size() * sizeof(half), cudaMemcpyHostToDevice));
    // Poison C with NaN bytes (0xFF): an element the kernel never writes fails.
    CUDA_CHECK(cudaMemset(device_c, 0xFF, static_cast<size_t>(m) * n * sizeof(float)));

    CUDA_CHECK(launchWmmaGemm(device_a, device_b, device_c, m, n, k, /*stream=*/0));
    CUDA_CHECK(cudaDeviceSynchronize());  // a program of its own may wait; an operator may not

    std::vector<float> c(static_cast<size_t>(m) * n);
    CUDA_CHECK(cudaMemcpy(c.data(), device_c, c.size() * sizeof(float), cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaFree(device_a));
    CUDA_CHECK(cudaFree(device_b));
    CUDA_CHECK(cudaFree(device_c));

    std::vector<double> reference(c.size()), magnitude(c.size());
    referenceGemm(a, b, reference, magnitude, m, n, k);
    double worst = 0.0;  // the largest |error| / bound over all elements
    bool finite = true;
    for (size_t i = 0; i < c.size(); ++i) {
        if (!std::isfinite(c[i])) finite = false;
        const double bound = k * std::ldexp(1.0, -23) * magnitude[i];
        worst = std::fmax(worst, std::fabs(c[i] - reference[i]) / bound);
    }
    const bool pass = finite && worst <= 1.0;
    printf("%5d x %5d x %5d   %6.2f%% of bound   %s\n", m, n, k, 100.0 * worst,
           pass ? "pass" : (finite ? "FAIL" : "FAIL (NaN or unwritten output)"));
    return pass;
}

// A machine with no GPU, or no driver, is said to be one: the runtime's own message
// there ("CUDA driver version is insufficient for CUDA runtime version", when no
// driver is installed) sends a reader looking for the wrong fix.
void requireDevice() {
    int count = 0;
    const cudaError_t status = cudaGetDeviceCount(&count);
    if (status == cudaSuccess && count > 0) return;
    fprintf(stderr, "gate: no CUDA device to run on (%s); the gate needs a GPU of sm_75 or newer\n",
            status == cudaSuccess ? "the driver sees none" : cudaGetErrorString(status));
    exit(EXIT_FAILURE);
}

int main() {
    requireDevice();
    int device;
    cudaDeviceProp properties;
    CUDA_CHECK(cudaGetDevice(&device));
    CUDA_CHECK(cudaGetDeviceProperties(&properties, device));
    printf("gate: %s, sm_%d%d\n", properties.name, properties.major, properties.minor);

    // The lesson's two shapes, a K that leaves a half-filled last stage (K % 32 ==
    // 16), a single tile, and a non-square shape with several tile groups.
    const int shapes[][3] = {{256, 512, 384}, {512, 1024, 128}, {128, 256, 48},
                             {128, 128, 16},  {1280, 384, 272}};
    std::mt19937 generator(87);
    bool all_pass = true;
    for (const auto& shape : shapes)
        all_pass &= checkShape(shape[0], shape[1], shape[2], generator);

    // The launcher must refuse a shape the tile does not divide, not run it.
    const bool refused = launchWmmaGemm(nullptr, nullptr, nullptr, 100, 128, 16, 0) ==
                         cudaErrorInvalidValue;
    printf("launcher refuses M=100: %s\n", refused ? "pass" : "FAIL");
    all_pass &= refused;
    CUDA_CHECK(cudaGetLastError());

    printf("gate: %s\n", all_pass ? "PASS" : "FAIL");
    return all_pass ? EXIT_SUCCESS : EXIT_FAILURE;
}
