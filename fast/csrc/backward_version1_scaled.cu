// fast/csrc/backward_version1_scaled.cu: the fast operator's backward helper,
// scaleToHalfKernel, and its launcher, launchScaleToHalf, which fast/csrc/binding.cpp
// calls; and backwardSwitchProblem, which it asks first about DAY87_FAST_BACKWARD.
//
// Built by fast/setup.py beside launch_policy.cu and binding.cpp; included by
// fast/proof/gate.cu, which checks it bit for bit with no PyTorch. It never exits and never
// waits: the launcher returns the launch status.

#include <cooperative_groups.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

namespace tuned {

namespace cooperative = cooperative_groups;

// ---------------------------------------------------------------------------
// The backward's helpers
// ---------------------------------------------------------------------------
// fast/csrc/binding.cpp's wmmaMmBackwardCuda computes grad_a = grad @ b^T and grad_b = a^T
// @ grad with cuBLAS on tensor cores, FP16 in, FP32 accumulate, FP16 out. grad arrives in
// FP32, and cast as it is its small values would be lost (FP16's smallest normal is 2^-14,
// about 6e-5). So it is multiplied by the power of two that puts its largest magnitude in
// [2^14, 2^15) before the cast, and cuBLAS multiplies each FP32 sum by the inverse power of
// two (its alpha) before it rounds the product to FP16: exact, since only exponents move.
// The largest magnitude never leaves the device (cuBLAS reads alpha from device memory), so
// nothing here waits for the GPU.
//
// One kernel, because the scale needs every element's magnitude before the first
// element can be cast, and a grid-wide barrier can stand between the two: (1) every
// block finds the largest magnitude of its share and writes it out; (2) after the
// barrier every block reads all of them, so every block derives the same scale, and
// casts its share. Its share stays on chip between the two where the chip can hold
// it (registers, then shared memory), so that most of grad is read once.
constexpr int kHelperThreads = 256;
// Four blocks of 256 threads per SM, 64 registers a thread: a T4's SM holds no more
// threads, and an H200's register file is then full.
constexpr int kScaleBlocksPerMultiprocessor = 4;
// Each thread's first float4s of a dense grad, held in registers from (1) to (2).
constexpr int kRegisterVectors = 8;
// The partial maxima's workspace holds this many floats; fast/csrc/binding.cpp allocates
// it.
extern const int kMaxHelperBlocks = 1024;

// The largest |value| over this block's threads, in every thread's return value.
__device__ float blockLargest(float value) {
    __shared__ float warp_largest[kHelperThreads / 32];
    for (int offset = 16; offset > 0; offset /= 2)
        value = fmaxf(value, __shfl_xor_sync(0xffffffffu, value, offset));
    if (threadIdx.x % 32 == 0) warp_largest[threadIdx.x / 32] = value;
    __syncthreads();
    value = warp_largest[0];
    for (int w = 1; w < kHelperThreads / 32; ++w) value = fmaxf(value, warp_largest[w]);
    return value;
}

// A grad that is row-major and whole (the usual case: (out * target).sum() hands over
// target itself) is read as one run of 16-byte float4s in sweeps across the whole
// grid, thread t taking float4 t of each sweep: the loads are as wide as they come,
// and every warp reads 512 contiguous bytes. Any other strides are walked rows by
// block and columns by thread, element by element, and read twice: coalesced for a
// row-major view, and right for any strides (autograd can hand over an expanded
// gradient: c.sum().backward() gives one with strides 0, 0).
struct StridedMatrix {
    const float* data;
    int64_t rows, cols, row_stride, col_stride;
    bool dense;  // row-major, whole, 16-byte aligned: read as float4s
};

// Four floats into four halves, each rounded once, written with one 8-byte store.
__device__ __forceinline__ void storeFourHalves(half* out, float4 value, float scale) {
    union {
        __half2 pairs[2];
        uint2 bits;
    } packed;
    packed.pairs[0] = __floats2half2_rn(value.x * scale, value.y * scale);
    packed.pairs[1] = __floats2half2_rn(value.z * scale, value.w * scale);
    *reinterpret_cast<uint2*>(out) = packed.bits;
}

__device__ __forceinline__ float largestOfFour(float4 v) {
    return fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
}

// Whether the cast waits for every block's largest magnitude is not left to timing:
// the gate's ordering build (fast/proof/gate_check.cuh) defines this to hold every
// block a while before it writes its own, so that a cast that does not wait reads the
// workspace's poison.
#ifndef DAY87_HOLD_PARTIAL_MAXIMA
#define DAY87_HOLD_PARTIAL_MAXIMA()
#endif

// Launched cooperatively (launchScaleToHalf): the runtime refuses the launch unless
// every block can be resident at once, which is what lets a block wait at the grid's
// barrier for blocks that would otherwise never start. `shared_vectors` float4s a
// thread are held in shared memory after the kRegisterVectors in registers.
__global__ void __launch_bounds__(kHelperThreads, kScaleBlocksPerMultiprocessor)
    scaleToHalfKernel(StridedMatrix grad, float* block_largest, half* scaled, float* alpha_and_beta,
                      int shared_vectors) {
    extern __shared__ float4 held_in_shared[];  // [sweep][thread]: conflict-free
    const float4* grad4 = reinterpret_cast<const float4*>(grad.data);
    const int64_t count = grad.rows * grad.cols, vectors = grad.dense ? count / 4 : 0;
    const int64_t first = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
    const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;  // one sweep
    const int64_t first_shared = first + kRegisterVectors * step;
    // This thread's sweeps in shared memory that hold data, counted first: a loop with
    // no early exit lets the compiler issue several loads before the first is used.
    const int shared_count = first_shared < vectors
        ? static_cast<int>(min((vectors - first_shared + step - 1) / step,
                               static_cast<int64_t>(shared_vectors)))
        : 0;
    const int64_t first_unheld = first_shared + shared_vectors * step;

    // (1) The largest magnitude, keeping what the chip can hold.
    float4 held[kRegisterVectors];  // unrolled loops index it by constants: registers
    float largest = 0.0f;
#pragma unroll
    for (int j = 0; j < kRegisterVectors; ++j) {
        const int64_t i = first + j * step;
        held[j] = i < vectors ? grad4[i] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        largest = fmaxf(largest, largestOfFour(held[j]));
    }
#pragma unroll 4
    for (int j = 0; j < shared_count; ++j) {
        const float4 v = grad4[first_shared + j * step];
        held_in_shared[j * blockDim.x + threadIdx.x] = v;
        largest = fmaxf(largest, largestOfFour(v));
    }
#pragma unroll 4
    for (int64_t i = first_unheld; i < vectors; i += step)
        largest = fmaxf(largest, largestOfFour(grad4[i]));
    if (grad.dense) {
        for (int64_t i = 4 * vectors + first; i < count; i += step)  // the last count % 4
            largest = fmaxf(largest, fabsf(grad.data[i]));
    } else {
        for (int64_t row = blockIdx.x; row < grad.rows; row += gridDim.x)
            for (int64_t col = threadIdx.x; col < grad.cols; col += blockDim.x)
                largest =
                    fmaxf(largest, fabsf(grad.data[row * grad.row_stride + col * grad.col_stride]));
    }
    largest = blockLargest(largest);
    DAY87_HOLD_PARTIAL_MAXIMA();
    if (threadIdx.x == 0) block_largest[blockIdx.x] = largest;
    // Every block's largest magnitude written and visible to every block (the barrier
    // orders memory too), and every warp of this one past blockLargest's shared reads.
    cooperative::this_grid().sync();

    // (2) The scale, the same in every block, and the cast.
    largest = 0.0f;
    for (int i = threadIdx.x; i < gridDim.x; i += blockDim.x)
        largest = fmaxf(largest, block_largest[i]);
    largest = blockLargest(largest);
    // largest = m * 2^e with m in [0.5, 1), so largest * 2^(15 - e) is in [2^14, 2^15).
    // 2^(15 - e) is built from its FP32 bits, biased exponent 127 + 15 - e, clamped to
    // the normal range; its reciprocal, biased exponent 254 minus that, is exact too.
    int exponent;
    frexpf(largest, &exponent);
    const int biased = min(max(142 - exponent, 1), 253);
    const float scale = __int_as_float(biased << 23);
    if (blockIdx.x == 0 && threadIdx.x == 0) {  // cuBLAS's alpha (the unscale) and beta
        alpha_and_beta[0] = __int_as_float((254 - biased) << 23);
        alpha_and_beta[1] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kRegisterVectors; ++j) {
        const int64_t i = first + j * step;
        if (i < vectors) storeFourHalves(scaled + 4 * i, held[j], scale);
    }
#pragma unroll 4
    for (int j = 0; j < shared_count; ++j)
        storeFourHalves(scaled + 4 * (first_shared + j * step),
                        held_in_shared[j * blockDim.x + threadIdx.x], scale);
    // The rest newest first: what (1) read last is the likeliest to be still in L2
    // (measured faster than oldest first at 4096 x 4096: fast/NOTES.md).
    if (first_unheld < vectors) {
#pragma unroll 4
        for (int64_t i = first_unheld + (vectors - 1 - first_unheld) / step * step;
             i >= first_unheld; i -= step)
            storeFourHalves(scaled + 4 * i, grad4[i], scale);
    }
    if (grad.dense) {
        for (int64_t i = 4 * vectors + first; i < count; i += step)
            scaled[i] = __float2half_rn(grad.data[i] * scale);
        return;
    }
    for (int64_t row = blockIdx.x; row < grad.rows; row += gridDim.x)
        for (int64_t col = threadIdx.x; col < grad.cols; col += blockDim.x)
            scaled[row * grad.cols + col] = __float2half_rn(
                grad.data[row * grad.row_stride + col * grad.col_stride] * scale);
}

// How the scale kernel fits on the current device, asked once per device and thread.
struct ScaleFit {
    int device;
    int resident_blocks;  // blocks that can all be resident at once
    int shared_vectors;   // float4s a thread can hold in shared memory beside them
};

cudaError_t currentScaleFit(ScaleFit* fit) {
    thread_local ScaleFit cached{-1, 0, 0};
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    if (cached.device != device) {
        int multiprocessors, shared_per_multiprocessor, shared_per_block, reserved_per_block;
        const cudaDeviceAttr attributes[] = {cudaDevAttrMultiProcessorCount,
                                             cudaDevAttrMaxSharedMemoryPerMultiprocessor,
                                             cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                             cudaDevAttrReservedSharedMemoryPerBlock};
        int* values[] = {&multiprocessors, &shared_per_multiprocessor, &shared_per_block,
                         &reserved_per_block};
        for (int i = 0; i < 4 && status == cudaSuccess; ++i)
            status = cudaDeviceGetAttribute(values[i], attributes[i], device);
        if (status != cudaSuccess) return status;
        // The SM's shared memory split among its blocks, less what the runtime reserves
        // for each and blockLargest's own, in whole sweeps of float4s.
        const int bytes = std::min(shared_per_block,
                                   shared_per_multiprocessor / kScaleBlocksPerMultiprocessor -
                                       reserved_per_block -
                                       static_cast<int>(kHelperThreads / 32 * sizeof(float)));
        const int shared_vectors =
            std::max(0, bytes / static_cast<int>(kHelperThreads * sizeof(float4)));
        const size_t shared_bytes = shared_vectors * kHelperThreads * sizeof(float4);
        status = cudaFuncSetAttribute(scaleToHalfKernel,
                                      cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(shared_bytes));
        int per_multiprocessor = 0;  // what the occupancy calculator says, not what was planned
        if (status == cudaSuccess)
            status = cudaOccupancyMaxActiveBlocksPerMultiprocessor(
                &per_multiprocessor, scaleToHalfKernel, kHelperThreads, shared_bytes);
        if (status != cudaSuccess) return status;
        cached = ScaleFit{device, per_multiprocessor * multiprocessors, shared_vectors};
    }
    *fit = cached;
    return cudaSuccess;
}

// grad (rows x cols, any strides) into `scaled` (row-major FP16), and into
// alpha_and_beta[0] the power of two to divide the products by (alpha_and_beta[1] = 0:
// cuBLAS reads beta from device memory too). `workspace` holds kMaxHelperBlocks floats.
cudaError_t launchScaleToHalf(const float* grad, int64_t rows, int64_t cols, int64_t row_stride,
                              int64_t col_stride, half* scaled, float* alpha_and_beta,
                              float* workspace, cudaStream_t stream) {
    ScaleFit fit;
    cudaError_t status = currentScaleFit(&fit);
    if (status != cudaSuccess) return status;
    const bool dense =
        col_stride == 1 && row_stride == cols && reinterpret_cast<std::uintptr_t>(grad) % 16 == 0;
    StridedMatrix matrix{grad, rows, cols, row_stride, col_stride, dense};
    // Enough blocks to hold a dense grad in registers, or one per row of a strided
    // one, up to what can be resident; shared memory only where registers fall short.
    const int64_t wanted = dense ? (rows * cols / 4 + kRegisterVectors * kHelperThreads - 1) /
                                       (kRegisterVectors * kHelperThreads)
                                 : rows;
    const int blocks = static_cast<int>(
        std::min<int64_t>(std::max<int64_t>(wanted, 1),
                          std::min(fit.resident_blocks, kMaxHelperBlocks)));
    int shared_vectors = dense && wanted > blocks ? fit.shared_vectors : 0;
    void* arguments[] = {&matrix, &workspace, &scaled, &alpha_and_beta, &shared_vectors};
    return cudaLaunchCooperativeKernel(reinterpret_cast<const void*>(scaleToHalfKernel), blocks,
                                       kHelperThreads, arguments,
                                       shared_vectors * kHelperThreads * sizeof(float4), stream);
}

// ---------------------------------------------------------------------------
// DAY87_FAST_BACKWARD
// ---------------------------------------------------------------------------
// The package holds one backward, this file's: DAY87_FAST_BACKWARD=scaled names it, and
// auto or unset take it. The switch stays so that the value that forced the backward in
// one launch, which left the package, is refused by name rather than run this backward
// unasked. Why it cannot be honoured, or "" where it can: binding.cpp raises with it.
std::string backwardSwitchProblem() {
    const char* value = std::getenv("DAY87_FAST_BACKWARD");
    if (value == nullptr || !std::strcmp(value, "") || !std::strcmp(value, "auto") ||
        !std::strcmp(value, "scaled"))
        return "";
    if (!std::strcmp(value, "one-launch"))
        return "DAY87_FAST_BACKWARD=one-launch: the backward in one launch left the package, "
               "behind this one at every size but the lesson's layer; its source: git show "
               "4771a90:fast/csrc/backward_version2_one_launch.cu; this package takes scaled "
               "or auto";
    return std::string("DAY87_FAST_BACKWARD must be scaled or auto; got '") + value + "'";
}

}  // namespace tuned
