// fast/csrc/binding.cpp: registers day87_fast::wmma_mm, wmma_mm_bias and wmma_mm_backward.
//
// In order: the contract for a and b, the bias's contract, the CUDA implementations
// (fast/csrc/launch_policy.cu's launcher, with a workspace for split K), the tensor-core
// backward in one dispatcher call (the scaling kernel, then cuBLAS on PyTorch's handle; or,
// where DAY87_FAST_BACKWARD=one-launch forces it,
// fast/csrc/backward_version2_one_launch.cu's one grid), the float64 CPU implementations,
// and the registrations under the namespace day87_fast, so that one process can load the
// lesson and this operator side by side.
//
// fast_op.py builds it with DAY87_WITH_CUDA when a toolkit is found, as op.py does.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#ifdef DAY87_WITH_CUDA
// The device guard and the current stream (CUDAGuard.h, CUDAStream.h), and PyTorch's
// cuBLAS handle for the backward's products (CUDAContext.h: it pulls in the cuBLAS,
// cuSPARSE and cuSOLVER headers, which fast_op.py finds where a minimal toolkit lacks
// them). CUDABlas.h has the guard that puts the handle's pointer mode back.
#include <ATen/cuda/CUDABlas.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Defined in fast/csrc/common.cuh (the tile that the shape must divide: the lesson's
// contract, copied), fast/csrc/launch_policy.cu (the launcher) and
// fast/csrc/backward_version1_scaled.cu (the backward's helpers). A declaration that
// differs from its definition still compiles and links; the library then fails to load on
// an undefined symbol. Change the two together.
namespace tuned {
extern const int kTileM, kTileN, kTileK;
cudaError_t launchFastGemm(const __half* a, const __half* b, const float* bias, float* c,
                           size_t m, size_t n, size_t k, float* workspace, cudaStream_t stream);
size_t fastGemmWorkspaceBytes(size_t m, size_t n, size_t k);
std::string kernelSwitchProblem();  // "" where DAY87_FAST_KERNEL can be honoured
// The backward's helpers.
cudaError_t launchScaleToHalf(const float* grad, int64_t rows, int64_t cols, int64_t row_stride,
                              int64_t col_stride, __half* scaled, float* alpha_and_beta,
                              float* workspace, cudaStream_t stream);
extern const int kMaxHelperBlocks;
// fast/csrc/backward_version2_one_launch.cu: "" where DAY87_FAST_BACKWARD can be honoured
// for this backward, and then which backward runs; the launcher of both products in one
// grid.
std::string chooseOneLaunchBackward(int64_t m, int64_t n, int64_t k, bool* one_launch);
cudaError_t launchOneLaunchBackward(const float* grad, int64_t grad_row_stride,
                                    int64_t grad_col_stride, const __half* a, const __half* b,
                                    __half* grad_a, __half* grad_b, int64_t m, int64_t n,
                                    int64_t k, cudaStream_t stream);
}  // namespace tuned
#endif

namespace {

// ---- A copy of the lesson's contract ----------------------------------------
// described() and checkContract below are the lesson's binding.cpp's, copied: every
// rule, in its order, with its message character for character (test_fast.py's table
// holds these messages to the lesson's rules). A copy, not an include, so that the
// lesson's binding.cpp is written for the student alone; it is kept in step by hand:
// a change to a rule there is made here too.

// What a message shows of a tensor: "[256, 512] Half on cuda:0" (op.py's described()).
std::string described(const at::Tensor& t) {
    return c10::str(t.sizes(), " ", t.scalar_type(), " on ", t.device());
}

// The input contract. Each failure is a TORCH_CHECK: a Python RuntimeError that
// names the rule and the values it saw, never a crash and never a silent copy.
// `op` names the operator in every message (each of this file's operators passes its
// own); `input_dtype` is what the device's implementation computes in; `tile_rules`
// adds what the CUDA kernel needs and the CPU reference does not.
void checkContract(const std::string& op, const at::Tensor& a, const at::Tensor& b,
                   at::ScalarType input_dtype, bool tile_rules) {
    // TORCH_CHECK builds its message from the arguments after the condition, and only
    // when the check fails.
    TORCH_CHECK(a.dim() == 2 && b.dim() == 2, op, ": rule 'two matrices': a and b must be 2-D; ",
                "got a: ", described(a), ", b: ", described(b));
    TORCH_CHECK(a.device() == b.device(), op, ": rule 'one device': a and b must be on the same ",
                "device; got a: ", described(a), ", b: ", described(b));
    TORCH_CHECK(a.scalar_type() == input_dtype && b.scalar_type() == input_dtype, op,
                ": rule 'dtype': on ", a.device(), " a and b must be ", input_dtype, "; got a: ",
                described(a), ", b: ", described(b));
    // Checked, never fixed with .contiguous(): that would copy the whole matrix on
    // every call, where the caller cannot see it in a profile.
    TORCH_CHECK(a.is_contiguous() && b.is_contiguous(), op, ": rule 'contiguous': a and b must ",
                "be row-major contiguous; got a: ", described(a), " with strides ", a.strides(),
                ", b: ", described(b), " with strides ", b.strides(),
                "; call .contiguous() to make the copy explicit");
    TORCH_CHECK(a.size(1) == b.size(0), op, ": rule 'inner dimensions': a.size(1) must equal ",
                "b.size(0); got a: ", described(a), ", b: ", described(b));
    if (!tile_rules) return;
#ifdef DAY87_WITH_CUDA
    TORCH_CHECK(a.size(0) % tuned::kTileM == 0 && b.size(1) % tuned::kTileN == 0 &&
                    a.size(1) % tuned::kTileK == 0,
                op, ": rule 'tile': M, N and K must be multiples of ", tuned::kTileM, ", ",
                tuned::kTileN, " and ", tuned::kTileK, "; got M=", a.size(0), ", N=", b.size(1),
                ", K=", a.size(1));
#endif
    // A view into the middle of a buffer (x[1:] of a 1-D buffer, say) can be
    // contiguous and still start off a 16-byte boundary; the kernel's 16-byte
    // copies would then fault and break the CUDA context for the whole process.
    const auto misalignment = [](const at::Tensor& t) {
        return reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16;
    };
    TORCH_CHECK(misalignment(a) == 0 && misalignment(b) == 0, op, ": rule 'alignment': a and b ",
                "must start on a 16-byte boundary; got storage offsets of ", a.storage_offset(),
                " and ", b.storage_offset(), " elements");
}

// wmma_mm_bias's contract: wmma_mm's rules for a and b, and the bias's own. The
// bias's device comes first: a CUDA bias beside CPU a and b is dispatched to the
// CUDA implementation, where a and b's dtype rule would blame a and b. The bias is
// one value per column of the output, in the dtype the device's implementation
// accumulates in (`bias_dtype`: torch.float32 on CUDA, torch.float64 on the CPU).
void checkContractWithBias(const std::string& op, const at::Tensor& a, const at::Tensor& b,
                           const at::Tensor& bias, at::ScalarType input_dtype,
                           at::ScalarType bias_dtype, bool tile_rules) {
    TORCH_CHECK(bias.device() == a.device(), op, ": rule 'one device': bias must be on a's ",
                "device; got a: ", described(a), ", bias: ", described(bias));
    checkContract(op, a, b, input_dtype, tile_rules);
    TORCH_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1), op, ": rule 'bias': bias must be ",
                "1-D with one value per column of b; got bias: ", described(bias), ", b: ",
                described(b));
    TORCH_CHECK(bias.scalar_type() == bias_dtype, op, ": rule 'dtype': on ", bias.device(),
                " bias must be ", bias_dtype, "; got bias: ", described(bias));
    TORCH_CHECK(bias.is_contiguous(), op, ": rule 'contiguous': bias must be contiguous; got ",
                "bias: ", described(bias), " with strides ", bias.strides());
}

#ifdef DAY87_WITH_CUDA
// wmma_mm and wmma_mm_bias share everything but the bias, nullptr for wmma_mm. The
// caller has checked the contract.
at::Tensor multiplyOnCuda(const std::string& op, const at::Tensor& a, const at::Tensor& b,
                          const float* bias) {
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);

    // The guard sets the current device to the tensors' device for the rest of
    // this scope and puts it back on the way out. Without it an operator called
    // on cuda:1 from a thread whose current device is 0 allocates on cuda:0.
    const c10::cuda::CUDAGuard guard(a.device());
    // A kernel forced by DAY87_FAST_KERNEL that this device cannot run is refused by name.
    const std::string switch_problem = tuned::kernelSwitchProblem();
    TORCH_CHECK(switch_problem.empty(), op + ": " + switch_problem);
    at::Tensor c = at::empty({m, n}, a.options().dtype(at::kFloat));
    if (c.numel() == 0) return c;  // an empty result: there is nothing to launch
    // Where the grid of tiles is too small for the card, the launcher splits K and
    // adds the splits' partial sums, which need room: from PyTorch's caching
    // allocator, on this stream, so no cudaMalloc, no sync, and a CUDA graph can
    // capture the call. Usually none is needed and nothing is allocated.
    const size_t workspace_floats = tuned::fastGemmWorkspaceBytes(m, n, k) / sizeof(float);
    at::Tensor workspace;
    if (workspace_floats)
        workspace = at::empty({static_cast<int64_t>(workspace_floats)}, c.options());

    // The current stream, not a new one and not the default one. PyTorch orders
    // the caller's work on this stream; a kernel on any other would run beside
    // the kernels that produce a and b, with no dependency on them.
    const cudaError_t status = tuned::launchFastGemm(
        reinterpret_cast<const __half*>(a.const_data_ptr<at::Half>()),
        reinterpret_cast<const __half*>(b.const_data_ptr<at::Half>()), bias,
        c.mutable_data_ptr<float>(),
        static_cast<size_t>(m), static_cast<size_t>(n), static_cast<size_t>(k),
        workspace.defined() ? workspace.mutable_data_ptr<float>() : nullptr,
        c10::cuda::getCurrentCUDAStream(a.device().index()).stream());
    // Raise, never exit: std::exit would end the interpreter without a traceback.
    TORCH_CHECK(status == cudaSuccess, op + ": launch failed: " + cudaGetErrorString(status));
    return c;
}

at::Tensor wmmaMmCuda(const at::Tensor& a, const at::Tensor& b) {
    // every message names the operator that raised it
    const std::string op = "day87_fast::wmma_mm";
    checkContract(op, a, b, at::kHalf, /*tile_rules=*/true);
    return multiplyOnCuda(op, a, b, nullptr);
}

at::Tensor wmmaMmBiasCuda(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
    const std::string op = "day87_fast::wmma_mm_bias";
    checkContractWithBias(op, a, b, bias, at::kHalf, at::kFloat, /*tile_rules=*/true);
    return multiplyOnCuda(op, a, b, bias.const_data_ptr<float>());
}

// One product of the backward, in cuBLAS's column-major terms, where a row-major
// X is the column-major X^T: out (rows x cols, row-major) = left @ right, with
// `left` and `right` FP16 row-major or, where `transpose_*`, the row-major matrix
// whose transpose is meant. cuBLAS accumulates in FP32, multiplies each sum by
// alpha and rounds it once to FP16: the unscale costs no pass of its own.
void halfProduct(const std::string& op, const __half* left, bool transpose_left,
                 const __half* right, bool transpose_right, __half* out, int64_t rows,
                 int64_t cols, int64_t depth, const float* alpha_and_beta) {
    // An empty product: cuBLAS would refuse its leading dimension.
    if (rows == 0 || cols == 0) return;
    TORCH_CHECK(rows <= INT_MAX && cols <= INT_MAX && depth <= INT_MAX, op,
                ": each size must fit cuBLAS's int; got ", rows, ", ", cols, " and ", depth);
    // PyTorch's handle for this device and thread, already bound to the current
    // stream and to a workspace from its caching allocator (so a CUDA graph can
    // capture the call). It is shared: each mode changed here is put back.
    const cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
    // alpha is the scale kernel's output: read from device memory, it needs no sync.
    const at::cuda::blas::PointerModeGuard device_scalars(handle, CUBLAS_POINTER_MODE_DEVICE);
    cublasMath_t math_mode;
    TORCH_CHECK(cublasGetMathMode(handle, &math_mode) == CUBLAS_STATUS_SUCCESS,
                op + ": cublasGetMathMode failed");
    // Without this flag cuBLAS may add a split K's partial sums in FP16, the output's
    // type; the products must be summed in FP32 and rounded once.
    cublasSetMathMode(handle,
                      static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    const int m = static_cast<int>(cols), n = static_cast<int>(rows), k = static_cast<int>(depth);
    // out^T = right^T @ left^T: cuBLAS's A is `right`, its B is `left`.
    const cublasStatus_t status = cublasGemmEx(
        handle, transpose_right ? CUBLAS_OP_T : CUBLAS_OP_N,
        transpose_left ? CUBLAS_OP_T : CUBLAS_OP_N,
        m, n, k, alpha_and_beta, right, CUDA_R_16F, transpose_right ? k : m, left, CUDA_R_16F,
        transpose_left ? n : k, alpha_and_beta + 1, out, CUDA_R_16F, m, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    cublasSetMathMode(handle, math_mode);
    TORCH_CHECK(status == CUBLAS_STATUS_SUCCESS,
                op + ": cublasGemmEx failed: " + cublasGetStatusString(status));
}

// The backward's products on tensor cores: grad_a = grad @ b^T where b is given and grad_b
// = a^T @ grad where a is given (the lesson's _setup_context saves each input only when its
// partner needs a gradient), FP16, from an FP32 grad. fast/csrc/backward_version1_scaled.cu
// says why grad is scaled by a power of two first. One dispatcher call and three kernels
// (the scaling, two cuBLAS products), or one where forced
// (fast/csrc/backward_version2_one_launch.cu): each op that autograd's backward thread
// issues costs tens of microseconds of host time, and the same work as twelve ATen ops made
// a small layer's step host-bound.
std::tuple<at::Tensor, at::Tensor> wmmaMmBackwardCuda(const at::Tensor& grad,
                                                      const std::optional<at::Tensor>& a,
                                                      const std::optional<at::Tensor>& b) {
    const std::string op = "day87_fast::wmma_mm_backward";
    TORCH_CHECK(grad.dim() == 2 && grad.scalar_type() == at::kFloat,
                op, ": grad must be a 2-D Float tensor; got ", described(grad));
    for (const auto* input : {&a, &b})
        TORCH_CHECK(!input->has_value() || ((*input)->scalar_type() == at::kHalf &&
                                            (*input)->device() == grad.device() &&
                                            (*input)->is_contiguous()),
                    op, ": a and b must be contiguous Half on grad's device; got ",
                    described(**input), " and grad ", described(grad));
    TORCH_CHECK(!b.has_value() || (b->dim() == 2 && b->size(1) == grad.size(1)),
                op + ": b must be K x N for an M x N grad");
    TORCH_CHECK(!a.has_value() || (a->dim() == 2 && a->size(0) == grad.size(0)),
                op + ": a must be M x K for an M x N grad");
    TORCH_CHECK(!a.has_value() || !b.has_value() || a->size(1) == b->size(0),
                op, ": a must be M x K and b K x N with one K; got a: ", described(*a), ", b: ",
                described(*b));
    const c10::cuda::CUDAGuard guard(grad.device());
    const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(grad.device().index()).stream();
    const int64_t m = grad.size(0), n = grad.size(1);
    const int64_t k = b.has_value() ? b->size(0) : a.has_value() ? a->size(1) : 0;
    // An undefined tensor reaches Python as None: no gradient for that input.
    at::Tensor grad_a = b.has_value() ? at::empty({m, k}, b->options()) : at::Tensor();
    at::Tensor grad_b = a.has_value() ? at::empty({k, n}, a->options()) : at::Tensor();
    if (grad.numel() == 0) {  // no sums to scale: each product is empty or all zeros
        for (auto* out : {&grad_a, &grad_b})
            if (out->defined()) out->zero_();
        return {grad_a, grad_b};
    }
    const auto input = [](const at::Tensor& t) {
        return reinterpret_cast<const __half*>(t.const_data_ptr<at::Half>());
    };
    const auto output = [](at::Tensor& t) {
        return reinterpret_cast<__half*>(t.mutable_data_ptr<at::Half>());
    };
    bool one_launch = false;
    const std::string refusal = tuned::chooseOneLaunchBackward(m, n, k, &one_launch);
    TORCH_CHECK(refusal.empty(), op, ": ", refusal);
    if (one_launch) {  // forced: both products in one grid, grad read in FP32
        const cudaError_t status = tuned::launchOneLaunchBackward(
            grad.const_data_ptr<float>(), grad.stride(0), grad.stride(1),
            a.has_value() ? input(*a) : nullptr, b.has_value() ? input(*b) : nullptr,
            grad_a.defined() ? output(grad_a) : nullptr,
            grad_b.defined() ? output(grad_b) : nullptr, m, n, k, stream);
        TORCH_CHECK(status == cudaSuccess, op + ": launch failed: " + cudaGetErrorString(status));
        return {grad_a, grad_b};
    }
    // From PyTorch's caching allocator, on this stream: no cudaMalloc, no sync, and
    // safe inside a CUDA graph capture. The last two floats are cuBLAS's alpha and beta.
    at::Tensor workspace = at::empty({tuned::kMaxHelperBlocks + 2}, grad.options());
    float* alpha_and_beta = workspace.mutable_data_ptr<float>() + tuned::kMaxHelperBlocks;
    at::Tensor scaled = at::empty(grad.sizes(), grad.options().dtype(at::kHalf));
    const cudaError_t status = tuned::launchScaleToHalf(
        grad.const_data_ptr<float>(), m, n, grad.stride(0), grad.stride(1), output(scaled),
        alpha_and_beta, workspace.mutable_data_ptr<float>(), stream);
    TORCH_CHECK(status == cudaSuccess, op + ": launch failed: " + cudaGetErrorString(status));
    if (grad_a.defined())  // M x K = (M x N) @ (K x N)^T
        halfProduct(op, input(scaled), false, input(*b), true, output(grad_a), m, k, n,
                    alpha_and_beta);
    if (grad_b.defined())  // K x N = (M x K)^T @ (M x N)
        halfProduct(op, input(*a), true, input(scaled), false, output(grad_b), k, n, m,
                    alpha_and_beta);
    return {grad_a, grad_b};
}
#endif


// The reference paths, float64, for gradcheck (as in the lesson's binding.cpp).
at::Tensor wmmaMmCpu(const at::Tensor& a, const at::Tensor& b) {
    checkContract("day87_fast::wmma_mm", a, b, at::kDouble, /*tile_rules=*/false);
    return at::mm(a, b);
}

at::Tensor wmmaMmBiasCpu(const at::Tensor& a, const at::Tensor& b, const at::Tensor& bias) {
    checkContractWithBias("day87_fast::wmma_mm_bias", a, b, bias, at::kDouble, at::kDouble,
                          /*tile_rules=*/false);
    return at::addmm(bias, a, b);
}

}  // namespace

TORCH_LIBRARY(day87_fast, m) {
    m.def("wmma_mm(Tensor a, Tensor b) -> Tensor");
    m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor");
    m.def("wmma_mm_backward(Tensor grad, Tensor? a, Tensor? b) -> (Tensor, Tensor)");
}

#ifdef DAY87_WITH_CUDA
TORCH_LIBRARY_IMPL(day87_fast, CUDA, m) {
    m.impl("wmma_mm", &wmmaMmCuda);
    m.impl("wmma_mm_bias", &wmmaMmBiasCuda);
    m.impl("wmma_mm_backward", &wmmaMmBackwardCuda);
}
#endif

TORCH_LIBRARY_IMPL(day87_fast, CPU, m) {
    m.impl("wmma_mm", &wmmaMmCpu);
    m.impl("wmma_mm_bias", &wmmaMmBiasCpu);
}
