// fast/proof/gate_backward.cuh: the gate's checks of the backward's two versions, the
// scaling kernel (version 1, grad scaled into FP16 for cuBLAS) and the backward in one
// launch (version 2), each against the CPU. Part of gate.cu's one translation unit,
// included after CUDA_CHECK and size_limit, which it uses; not a header of its own.

// ---------------------------------------------------------------------------
// Version 1: the backward's scaling (backward_version1_scaled.cu)
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

    // The CPU's arithmetic, as backward_version1_scaled.cu's comment states it.
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

// The scaling's shapes: grad held in registers (with the largest first), a count that
// is not a multiple of 4 (and the largest last), held in registers and shared memory
// with the rest read twice (a 64 MB grad; the largest in the last float4), a
// transposed view, walked element by element, and rows padded to a longer row stride:
// the gradient that torch.cat([c1, c2], dim=1) hands c1, 200 of every 256 floats,
// which is row-major and 16-byte aligned and still not one dense run.
bool checkScaleShapes(std::mt19937& generator) {
    bool pass = checkScale("registers", 256, 512, 512, 1, 0, 0, generator);
    pass &= checkScale("count % 4 == 3", 129, 131, 131, 1, 128, 130, generator);
    pass &= checkScale("shared memory, read twice", 4096, 4096, 4096, 1, 4095, 4094, generator);
    pass &= checkScale("transposed view", 300, 200, 1, 300, 45, 41, generator);
    pass &= checkScale("padded rows (torch.cat's part)", 300, 200, 256, 1, 299, 199, generator);
    return pass;
}

// ---------------------------------------------------------------------------
// Version 2: the backward in one launch (backward_version2_one_launch.cu)
// ---------------------------------------------------------------------------
// grad_a = grad @ b^T and
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
