// fast/csrc/backward_version2_one_launch.cu: the fast operator's backward with both
// products in one launch, meant for a small layer: oneLaunchBackwardKernel, and
// launchOneLaunchBackward, which fast/csrc/binding.cpp calls where
// DAY87_FAST_BACKWARD=one-launch forces it and 32 divides M, N and K. It is the backward's
// second version, a measured experiment: ahead of the first (the three kernels of
// fast/csrc/backward_version1_scaled.cu and cuBLAS) at the lesson's layer alone, behind at
// every other size measured, so never chosen unforced (fast/NOTES.md, "The backward in one
// launch", has its three forms and their figures).
//
// Built by fast/setup.py beside launch_policy.cu, backward_version1_scaled.cu
// and binding.cpp; included by fast/proof/gate.cu, which checks it against float64 with no
// PyTorch (the gate's --backward). It never exits and never waits: the launcher returns the
// launch status.
//
// fast/csrc/backward_version1_scaled.cu's backward is three kernels: the scaling, then two
// cuBLAS products. At a small layer each of them costs about what an empty launch and a few
// round trips to memory cost, whatever its work, so the three cost three times one
// (fast/NOTES.md, "The backward", has the figures). Here one grid computes both products:
// its first blocks the tiles of grad_a = grad @ b^T, the rest the tiles of grad_b = a^T @
// grad.
//
// And no scaling: the tensor cores' TF32 (sm_80 and up) has FP32's 8-bit exponent and
// FP16's 10-bit fraction. grad is read in FP32 and rounded once to TF32, which loses
// what the scaled cast to FP16 loses at best (a relative 2^-11) and never underflows,
// so no kernel has to find grad's largest magnitude before the first product can
// start. a and b are FP16 and exact in TF32. The sums are FP32, rounded once to FP16.
//
// Code for below sm_80 (a T4's build) has no TF32: there the kernel's body is empty,
// and the launcher refuses (oneLaunchBackwardRuns says which code the device runs).

#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <type_traits>

namespace tuned {

namespace wmma = nvcuda::wmma;

// A block computes a 32 x 32 tile of one gradient. The inner dimension (N for grad_a,
// M for grad_b) is cut into chunks of 32, dealt to the block's 8 warps in turn: warp w
// multiplies chunks w, w + 8, ..., each into sums of its own, in shared memory of its
// own, so no warp waits for another until the end, when the 8 sums are added. A
// small layer's inner dimension is a few chunks a warp (the lesson's layer: 2 for
// grad_a, 1 for grad_b), so a block makes a round trip to memory or two, not one a
// chunk.
constexpr int kBackwardTile = 32;
constexpr int kBackwardWarps = 8;
constexpr int kBackwardThreads = 32 * kBackwardWarps;
// Shared rows of 32 floats padded by 4: wmma wants a multiple of 4 floats, and the
// 4 move each row's start by 4 banks, so that grad_a's fragments (read along rows)
// load with no two lanes on one bank; grad_b's a^T and grad, read down columns, are
// left with some lanes sharing a bank (worked out from the fragments' layout, not
// measured).
constexpr int kBackwardStride = kBackwardTile + 4;
constexpr int kBackwardChunkFloats = kBackwardTile * kBackwardStride;  // one operand's chunk
// A warp's shared memory: a chunk of each operand, then (reused) its 32 x 32 sums.
constexpr int kBackwardWarpFloats = 2 * kBackwardChunkFloats;
constexpr size_t kBackwardSharedBytes = kBackwardWarps * kBackwardWarpFloats * sizeof(float);

// The products' operands: grad (M x N, FP32, any strides), a (M x K) and b (K x N),
// FP16 and row-major; grad_a (M x K) and grad_b (K x N), FP16 and row-major, or null
// where that gradient is not wanted.
struct BackwardOperands {
    const float* grad;
    int64_t grad_row_stride, grad_col_stride;
    const half* a;
    const half* b;
    half* grad_a;
    half* grad_b;
    int64_t m, n, k;
};

// One operand of a block's product: the 32 x 32 values at rows [row, row + 32) and
// columns [col, col + 32) of `data`, for chunk c at row + 32c (inner_is_row) or column
// col + 32c. Stored in shared memory as [row][column], the column being the one that
// is contiguous in global memory: lane l reads column l of each row, so a warp's load
// is 32 neighbours.
template <typename T>
struct ChunkSource {
    const T* data;
    int64_t row_stride, col_stride, row, col;
    bool inner_is_row;
};

__device__ __forceinline__ float widened(float value) { return value; }
__device__ __forceinline__ float widened(half value) { return __half2float(value); }

// A chunk of an operand on its way to shared memory, 32 values a lane. grad's FP32
// values are copied there by cp.async (sm_80 and up), not through registers: with
// fewer registers a thread, two blocks fit on an SM. An FP16 operand's values come
// through registers, widened to FP32 (exactly) on the way.
template <typename T>
struct ChunkInFlight {
    float values[kBackwardTile];  // unused for FP32
};

// TF32's WMMA and cp.async are sm_80 and up (and the host's pass declares them).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 800
template <typename T>
__device__ __forceinline__ void fetchChunk(const ChunkSource<T>& source, int64_t chunk,
                                           float* shared, ChunkInFlight<T>& flight) {
    const int64_t row = source.row + (source.inner_is_row ? chunk * kBackwardTile : 0);
    const int64_t col = source.col + (source.inner_is_row ? 0 : chunk * kBackwardTile);
    const T* first = source.data + row * source.row_stride + (col + threadIdx.x % 32) *
                                                                 source.col_stride;
    if constexpr (std::is_same<T, float>::value) {
        const unsigned place = static_cast<unsigned>(__cvta_generic_to_shared(shared)) +
                               threadIdx.x % 32 * static_cast<unsigned>(sizeof(float));
#pragma unroll
        for (int r = 0; r < kBackwardTile; ++r)
            asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(
                             place + r * kBackwardStride * static_cast<unsigned>(sizeof(float))),
                         "l"(first + r * source.row_stride));
        asm volatile("cp.async.commit_group;\n" ::);
    } else {
#pragma unroll
        for (int r = 0; r < kBackwardTile; ++r)
            flight.values[r] = widened(first[r * source.row_stride]);
    }
}

// The chunk in shared memory: an FP16 operand's values stored, grad's copies waited for.
template <typename T>
__device__ __forceinline__ void landChunk(const ChunkInFlight<T>& flight, float* shared) {
    if constexpr (std::is_same<T, float>::value) {
        asm volatile("cp.async.wait_all;\n" ::: "memory");
    } else {
#pragma unroll
        for (int r = 0; r < kBackwardTile; ++r)
            shared[r * kBackwardStride + threadIdx.x % 32] = flight.values[r];
    }
}

// A fragment's values rounded to TF32, where the tensor cores would otherwise drop the
// low bits of grad's FP32 values; FP16 values are exact in TF32 and stay as they are.
template <typename Fragment>
__device__ __forceinline__ void roundedToTf32(Fragment& fragment) {
#pragma unroll
    for (int e = 0; e < fragment.num_elements; ++e)
        fragment.x[e] = wmma::__float_to_tf32(fragment.x[e]);
}

// Where the fragment whose first value is at (row, col) of an operand starts, for an
// operand stored [row][col] (row_major) or stored transposed, [col][row] (col_major).
template <typename Layout>
__device__ __forceinline__ int fragmentOffset(int row, int col) {
    return std::is_same<Layout, wmma::row_major>::value ? row * kBackwardStride + col
                                                        : col * kBackwardStride + row;
}

using BackwardSums = wmma::fragment<wmma::accumulator, 16, 16, 8, float>;

// One block's tile: out (32 x 32 at out_row, out_col, row stride out_stride) = the sum
// over `chunks` chunks of left (32 x 32 a chunk) times right (32 x 32 a chunk). Left is
// stored as LeftLayout says: row_major for grad's rows, col_major for a's columns (a
// read as [inner][tile row] is a^T); right the same way: col_major for b's rows (b^T),
// row_major for grad's rows. `shared`: the kernel's shared memory.
template <typename LeftLayout, typename RightLayout, typename LeftT, typename RightT>
__device__ __forceinline__ void backwardTile(const ChunkSource<LeftT>& left_source,
                                             const ChunkSource<RightT>& right_source,
                                             int64_t chunks, half* out, int64_t out_stride,
                                             int64_t out_row, int64_t out_col, float* shared) {
    const int warp = threadIdx.x / 32;
    float* left = shared + warp * kBackwardWarpFloats;
    float* right = left + kBackwardChunkFloats;
    BackwardSums sums[2][2];
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j) wmma::fill_fragment(sums[i][j], 0.0f);

    ChunkInFlight<LeftT> left_flight;
    ChunkInFlight<RightT> right_flight;
    if (warp < chunks) {
        fetchChunk(left_source, warp, left, left_flight);
        fetchChunk(right_source, warp, right, right_flight);
    }
    for (int64_t chunk = warp; chunk < chunks; chunk += kBackwardWarps) {
        landChunk(left_flight, left);
        landChunk(right_flight, right);
        __syncwarp();  // the chunk in shared memory before any lane reads it
#pragma unroll
        for (int t = 0; t < kBackwardTile; t += 8) {
            wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LeftLayout> a[2];
            wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, RightLayout> b[2];
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                wmma::load_matrix_sync(a[i], left + fragmentOffset<LeftLayout>(16 * i, t),
                                       kBackwardStride);
                roundedToTf32(a[i]);
            }
#pragma unroll
            for (int j = 0; j < 2; ++j) {
                wmma::load_matrix_sync(b[j], right + fragmentOffset<RightLayout>(t, 16 * j),
                                       kBackwardStride);
                roundedToTf32(b[j]);
            }
#pragma unroll
            for (int i = 0; i < 2; ++i)
#pragma unroll
                for (int j = 0; j < 2; ++j) wmma::mma_sync(sums[i][j], a[i], b[j], sums[i][j]);
        }
        __syncwarp();  // every lane done with the chunk before the next lands
        if (chunk + kBackwardWarps < chunks) {
            fetchChunk(left_source, chunk + kBackwardWarps, left, left_flight);
            fetchChunk(right_source, chunk + kBackwardWarps, right, right_flight);
        }
    }

    // Each warp's sums into its own shared memory, then the 8 added for each value,
    // warp 0's first and warp 7's last: the same bits from call to call.
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 2; ++j)
            wmma::store_matrix_sync(left + 16 * i * kBackwardStride + 16 * j, sums[i][j],
                                    kBackwardStride, wmma::mem_row_major);
    __syncthreads();  // every warp's sums stored before any thread adds them
    // Thread t adds two neighbours of row t / 16 and of row t / 16 + 16, rounds them once
    // to FP16 and stores each pair in one store: a warp writes two 64-byte rows.
#pragma unroll
    for (int half_tile = 0; half_tile < 2; ++half_tile) {
        const int row = threadIdx.x / 16 + 16 * half_tile, col = threadIdx.x % 16 * 2;
        float first = 0.0f, second = 0.0f;
#pragma unroll
        for (int w = 0; w < kBackwardWarps; ++w) {
            const float* sum = shared + w * kBackwardWarpFloats + row * kBackwardStride + col;
            first += sum[0];
            second += sum[1];
        }
        *reinterpret_cast<__half2*>(out + (out_row + row) * out_stride + out_col + col) =
            __floats2half2_rn(first, second);
    }
}
#endif

// Blocks [0, tiles of grad_a) compute grad_a's tiles, row by row of tiles; the rest
// grad_b's.
__global__ void __launch_bounds__(kBackwardThreads, 2) oneLaunchBackwardKernel(BackwardOperands p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    // Dynamic, past the 48 KB of a static array; 128-byte aligned, and wmma needs each
    // fragment 32-byte aligned.
    extern __shared__ __align__(128) float shared[];
    const int64_t tiles_a = p.grad_a ? p.m / kBackwardTile * (p.k / kBackwardTile) : 0;
    const int64_t tile = blockIdx.x;
    if (tile < tiles_a) {  // grad_a = grad @ b^T: M x K, summed over N
        const int64_t row = tile / (p.k / kBackwardTile) * kBackwardTile;
        const int64_t col = tile % (p.k / kBackwardTile) * kBackwardTile;
        const ChunkSource<float> grad{p.grad, p.grad_row_stride, p.grad_col_stride, row, 0,
                                      false};
        const ChunkSource<half> b{p.b, p.n, 1, col, 0, false};  // b's rows col.. : b^T's columns
        backwardTile<wmma::row_major, wmma::col_major>(grad, b, p.n / kBackwardTile, p.grad_a,
                                                       p.k, row, col, shared);
    } else {  // grad_b = a^T @ grad: K x N, summed over M
        const int64_t row = (tile - tiles_a) / (p.n / kBackwardTile) * kBackwardTile;
        const int64_t col = (tile - tiles_a) % (p.n / kBackwardTile) * kBackwardTile;
        const ChunkSource<half> a{p.a, p.k, 1, 0, row, true};  // a's columns row.. : a^T's rows
        const ChunkSource<float> grad{p.grad, p.grad_row_stride, p.grad_col_stride, 0, col,
                                      true};
        backwardTile<wmma::col_major, wmma::row_major>(a, grad, p.m / kBackwardTile, p.grad_b,
                                                       p.n, row, col, shared);
    }
#endif
}

// ---------------------------------------------------------------------------
// Which backward runs, and the launcher
// ---------------------------------------------------------------------------
// DAY87_FAST_BACKWARD=one-launch forces this kernel; scaled, auto or unset run
// fast/csrc/backward_version1_scaled.cu's three kernels.
enum class BackwardSwitch { kAuto, kOneLaunch, kScaled, kUnknown };

BackwardSwitch backwardSwitch() {
    const char* value = std::getenv("DAY87_FAST_BACKWARD");
    if (value == nullptr || !std::strcmp(value, "") || !std::strcmp(value, "auto"))
        return BackwardSwitch::kAuto;
    if (!std::strcmp(value, "one-launch")) return BackwardSwitch::kOneLaunch;
    if (!std::strcmp(value, "scaled")) return BackwardSwitch::kScaled;
    return BackwardSwitch::kUnknown;
}

// Whether the current device runs the kernel's body: code for sm_80 or newer (the PTX
// architecture it was compiled for, which a compute_75 build runs on any card), asked
// once per device and thread.
cudaError_t oneLaunchBackwardRuns(bool* runs) {
    thread_local int cached_device = -1;
    thread_local bool cached_runs = false;
    int device;
    cudaError_t status = cudaGetDevice(&device);
    if (status != cudaSuccess) return status;
    if (cached_device != device) {
        cudaFuncAttributes attributes;
        status = cudaFuncGetAttributes(&attributes, oneLaunchBackwardKernel);
        const bool runs = status == cudaSuccess && attributes.ptxVersion >= 80;
        if (runs)  // more than the 48 KB a block has without asking
            status = cudaFuncSetAttribute(oneLaunchBackwardKernel,
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          static_cast<int>(kBackwardSharedBytes));
        if (status != cudaSuccess) {
            cudaGetLastError();  // returned here: not left for the next caller to find
            return status;
        }
        cached_device = device;
        cached_runs = runs;
    }
    *runs = cached_runs;
    return cudaSuccess;
}

// Why the one launch cannot run an M x N x K backward, or "" where it can: each size a
// multiple of the tile (the forward's tile rule guarantees M and N; K is a multiple
// of 16 there), and code with TF32.
const char* oneLaunchRefusal(int64_t m, int64_t n, int64_t k, bool runs) {
    if (!runs) return "this device runs no code for sm_80 or newer (TF32's tensor cores)";
    if (m % kBackwardTile != 0 || n % kBackwardTile != 0 || k % kBackwardTile != 0)
        return "M, N and K must be multiples of 32";
    return "";
}

// Why DAY87_FAST_BACKWARD cannot be honoured, or "" where it can; then *one_launch says
// which backward runs an M x N x K backward. Forced, the one launch runs every backward
// whose sizes the tile divides, and the three kernels the rest (as version 4, forced,
// leaves an odd number of tile rows to version 3); a device with no TF32 code refuses.
std::string chooseOneLaunchBackward(int64_t m, int64_t n, int64_t k, bool* one_launch) {
    *one_launch = false;
    const BackwardSwitch wanted = backwardSwitch();
    if (wanted == BackwardSwitch::kUnknown)
        return std::string("DAY87_FAST_BACKWARD must be one-launch, scaled or auto; got '") +
               std::getenv("DAY87_FAST_BACKWARD") + "'";
    if (wanted != BackwardSwitch::kOneLaunch) return "";  // the device is not even asked
    bool runs;
    const cudaError_t status = oneLaunchBackwardRuns(&runs);
    if (status != cudaSuccess)
        return std::string("DAY87_FAST_BACKWARD=one-launch: ") + cudaGetErrorString(status);
    if (!runs)
        return "DAY87_FAST_BACKWARD=one-launch, and this device runs no code for sm_80 or newer "
               "(TF32's tensor cores)";
    *one_launch = *oneLaunchRefusal(m, n, k, runs) == '\0';
    return "";
}

// The launch: grad_a and grad_b, or the one of them that is not null (binding.cpp
// passes null for a gradient that autograd does not want).
cudaError_t launchOneLaunchBackward(const float* grad, int64_t grad_row_stride,
                                    int64_t grad_col_stride, const half* a, const half* b,
                                    half* grad_a, half* grad_b, int64_t m, int64_t n, int64_t k,
                                    cudaStream_t stream) {
    bool runs;
    const cudaError_t status = oneLaunchBackwardRuns(&runs);
    if (status != cudaSuccess) return status;
    if (*oneLaunchRefusal(m, n, k, runs) != '\0') return cudaErrorInvalidValue;
    const int64_t tiles = ((grad_a ? m * k : 0) + (grad_b ? k * n : 0)) / kBackwardTile /
                          kBackwardTile;
    if (tiles == 0) return cudaSuccess;
    if (tiles > INT32_MAX) return cudaErrorInvalidValue;
    const BackwardOperands operands{grad, grad_row_stride, grad_col_stride, a, b, grad_a,
                                    grad_b, m, n, k};
    oneLaunchBackwardKernel<<<static_cast<unsigned>(tiles), kBackwardThreads,
                              kBackwardSharedBytes, stream>>>(operands);
    return cudaGetLastError();
}

}  // namespace tuned
