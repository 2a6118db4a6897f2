// fast/proof/gate_backward.cuh: the gate's checks of the backward's scaling kernel (grad
// scaled into FP16 for cuBLAS), against the same arithmetic on the CPU. Part of gate.cu's
// one translation unit, included after gate_check.cuh (CUDA_CHECK, size_limit) and
// backward_version1_scaled.cu; not a header of its own.

// ---------------------------------------------------------------------------
// The backward's scaling (backward_version1_scaled.cu)
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
