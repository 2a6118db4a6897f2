// fast/csrc/binding.cpp: registers day87_fast::wmma_mm, wmma_mm_bias and wmma_mm_backward
// on the LibTorch stable ABI, so that one built library loads in every torch from 2.11 on
// (the CUDA library, in one built with the same CUDA major version as the build's).
//
// The lesson's binding.cpp uses the classic API (ATen, c10, torch/library.h): its library
// calls C++ functions of the one libtorch it was compiled against. This file includes
// torch/csrc/stable, torch/headeronly and one C header of AOTInductor's shim (for addmm),
// whose calls go through a C interface that later torch versions keep (setup.py compiles
// it with TORCH_TARGET_VERSION set to 2.11, under which any other torch header stops the
// build). fast/csrc/README.md sets each line of the lesson's binding beside its stable form.
//
// In order: the messages, the contracts for a, b and the bias, the CUDA
// implementations (fast/csrc/launch_policy.cu's launcher, with a workspace for split K), the
// tensor-core backward in one dispatcher call (the scaling kernel, then cuBLAS on PyTorch's
// handle), the float64 CPU implementations, and the registrations under the namespace
// day87_fast, so that one process can load the lesson and this operator side by side.
//
// setup.py builds it twice: with DAY87_WITH_CUDA and USE_CUDA beside the CUDA sources, and
// alone for a torch built without CUDA.

#include <torch/csrc/stable/accelerator.h>
#include <torch/csrc/stable/c/shim.h>
#include <torch/csrc/stable/library.h>
#include <torch/csrc/stable/ops.h>
#include <torch/csrc/stable/tensor.h>
#include <torch/headeronly/core/ScalarType.h>
// addmm for the CPU reference: the stable ops have no addmm, and a dispatcher call cannot
// pass its Scalar arguments (beta, alpha). AOTInductor's C function for it can.
#include <torch/csrc/inductor/aoti_torch/generated/c_shim_cpu.h>

#include <climits>
#include <cstdint>
#include <optional>
#include <sstream>
#include <stdexcept>
#include <string>
#include <tuple>

#ifdef DAY87_WITH_CUDA
#include <cublas_v2.h>  // the backward's products; setup.py links cuBLAS (torch has loaded it)
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Defined in fast/csrc/common.cuh (the tile that the shape must divide: the lesson's
// contract, copied), fast/csrc/launch_policy.cu (the launcher) and
// fast/csrc/backward_version1_scaled.cu (the backward's helpers and its switch). A declaration that
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
std::string backwardSwitchProblem();  // "" where DAY87_FAST_BACKWARD can be honoured
}  // namespace tuned
#endif

namespace {

using torch::headeronly::ScalarType;
using torch::stable::Tensor;

// ---- Messages ---------------------------------------------------------------
// The classic API's TORCH_CHECK builds its message with c10::str, and the stable ABI's
// STD_TORCH_CHECK puts the function, file and line in front of it. Neither fits: the
// messages here are the lesson's, word for word. So `require` throws a plain
// std::runtime_error, which reaches Python as a RuntimeError with exactly its text.

// "[256, 512]": how c10 prints a tensor's sizes or strides.
std::string listed(torch::headeronly::IntHeaderOnlyArrayRef values) {
    std::string text = "[";
    for (size_t i = 0; i < values.size(); ++i)
        text += (i ? ", " : "") + std::to_string(values[i]);
    return text + "]";
}

// "cuda:0", "cpu": how c10 prints a device.
std::string deviceName(const torch::stable::Device& device) {
    switch (device.type()) {
        case torch::headeronly::DeviceType::CPU: return "cpu";
        case torch::headeronly::DeviceType::Meta: return "meta";
        case torch::headeronly::DeviceType::CUDA:
            return device.index() < 0 ? "cuda"
                                      : "cuda:" + std::to_string(static_cast<int>(device.index()));
        default: return "device type " + std::to_string(static_cast<int>(device.type()));
    }
}

std::string typeName(ScalarType type) {  // "Half": C++'s name, which PyTorch's errors use
    return torch::headeronly::toString(type);
}

// What a message shows of a tensor: "[256, 512] Half on cuda:0" (op.py's described()).
std::string described(const Tensor& t) {
    return listed(t.sizes()) + " " + typeName(t.scalar_type()) + " on " + deviceName(t.device());
}

// The message's parts, streamed: text, numbers.
template <typename... Parts>
std::string joined(const Parts&... parts) {
    std::ostringstream text;
    (text << ... << parts);
    return text.str();
}

// A rule: where `holds` is false, raise the message that `message()` builds. The message
// is built only then: a call that keeps the contract pays for no string.
template <typename Message>
void require(bool holds, const Message& message) {
    if (!holds) throw std::runtime_error(message());
}

// ---- A copy of the lesson's contract ----------------------------------------
// checkContract and checkContractWithBias below are the lesson's binding.cpp's, copied:
// every rule, in its order, with its message character for character
// (fast/tests/test_wheel.py compares whole messages). A copy, not an include, so that the
// lesson's binding.cpp is written for the student alone; it is kept in step by hand: a
// change to a rule there is made here too.
//
// Where this operator departs from the lesson's, said where it does and stated in
// fast/tests/test_wheel.py: the CPU reference takes b column-major too, and the CUDA
// refusals of a column-major b and of a ragged M say what the CPU takes.

// b column-major: a K x N matrix whose transpose is row-major, strides (1, K), as
// nn.Linear's weight.t() is. is_contiguous's test on the transpose's sizes and strides:
// a size of 1 constrains no stride, and an empty matrix is either layout.
bool columnMajor(const Tensor& t) {
    if (t.dim() != 2) return false;
    if (t.numel() == 0) return true;
    int64_t expected_stride = 1;
    for (int64_t dimension = 0; dimension < 2; ++dimension) {  // the transpose's last first
        if (t.size(dimension) == 1) continue;
        if (t.stride(dimension) != expected_stride) return false;
        expected_stride *= t.size(dimension);
    }
    return true;
}

// The CUDA refusals' notes: what the CPU reference takes and the CUDA kernels do not yet,
// until a GPU run proves their column-major b and masked tail rows (the Python fake holds
// the second, word for word: fast/src/day87_fast/lesson_copy.py's RAGGED_M_ON_CUDA).
const char* const kColumnMajorOnCuda =
    "the CPU reference reads a column-major b (strides (1, K)) in place; CUDA will once a GPU "
    "run proves its kernels on it";
const char* const kRaggedMOnCuda =
    "the CPU reference takes any M; CUDA will once a GPU run proves its kernels' masked tail "
    "rows";

// The input contract. Each failure is a Python RuntimeError that names the rule and the
// values it saw, never a crash and never a silent copy. `op` names the operator in every
// message (each of this file's operators passes its own); `input_dtype` is what the
// device's implementation computes in; `kernel_rules` adds what the CUDA kernels need and
// the CPU reference does not: the tile, b row-major, a 16-byte start.
void checkContract(const std::string& op, const Tensor& a, const Tensor& b,
                   ScalarType input_dtype, bool kernel_rules) {
    require(a.dim() == 2 && b.dim() == 2, [&] {
        return joined(op, ": rule 'two matrices': a and b must be 2-D; got a: ", described(a),
                      ", b: ", described(b));
    });
    require(a.device() == b.device(), [&] {
        return joined(op, ": rule 'one device': a and b must be on the same device; got a: ",
                      described(a), ", b: ", described(b));
    });
    require(a.scalar_type() == input_dtype && b.scalar_type() == input_dtype, [&] {
        return joined(op, ": rule 'dtype': on ", deviceName(a.device()), " a and b must be ",
                      typeName(input_dtype), "; got a: ", described(a), ", b: ", described(b));
    });
    // Checked, never fixed with a copy: that would copy the whole matrix on every call,
    // where the caller cannot see it in a profile. The CPU reference's matmul reads a
    // column-major b in place (BLAS's transpose flag): nn.Linear's weight.t() needs no copy.
    const bool b_read = b.is_contiguous() || (!kernel_rules && columnMajor(b));
    require(a.is_contiguous() && b_read, [&] {
        const std::string seen = joined("; got a: ", described(a), " with strides ",
                                        listed(a.strides()), ", b: ", described(b),
                                        " with strides ", listed(b.strides()),
                                        "; call .contiguous() to make the copy explicit");
        if (!kernel_rules)
            return joined(op, ": rule 'contiguous': a must be row-major contiguous, and b "
                          "row-major (strides (N, 1)) or column-major (strides (1, K))", seen);
        const bool b_column_major = !b.is_contiguous() && columnMajor(b);
        const std::string note = b_column_major ? joined("; ", kColumnMajorOnCuda) : "";
        return joined(op, ": rule 'contiguous': a and b must be row-major contiguous", seen,
                      note);
    });
    require(a.size(1) == b.size(0), [&] {
        return joined(op, ": rule 'inner dimensions': a.size(1) must equal b.size(0); got a: ",
                      described(a), ", b: ", described(b));
    });
    if (!kernel_rules) return;
#ifdef DAY87_WITH_CUDA
    require(a.size(0) % tuned::kTileM == 0 && b.size(1) % tuned::kTileN == 0 &&
                a.size(1) % tuned::kTileK == 0,
            [&] {
                const std::string note =
                    a.size(0) % tuned::kTileM != 0 ? joined("; ", kRaggedMOnCuda) : "";
                return joined(op, ": rule 'tile': M, N and K must be multiples of ",
                              tuned::kTileM, ", ", tuned::kTileN, " and ", tuned::kTileK,
                              "; got M=", a.size(0), ", N=", b.size(1), ", K=", a.size(1), note);
            });
#endif
    // A view into the middle of a buffer (x[1:] of a 1-D buffer, say) can be
    // contiguous and still start off a 16-byte boundary; the kernel's 16-byte
    // copies would then fault and break the CUDA context for the whole process.
    const auto misalignment = [](const Tensor& t) {
        return reinterpret_cast<std::uintptr_t>(t.const_data_ptr()) % 16;
    };
    require(misalignment(a) == 0 && misalignment(b) == 0, [&] {
        return joined(op, ": rule 'alignment': a and b must start on a 16-byte boundary; got ",
                      "storage offsets of ", a.storage_offset(), " and ", b.storage_offset(),
                      " elements");
    });
}

// wmma_mm_bias's contract: wmma_mm's rules for a and b, and the bias's own. The
// bias's device comes first: a CUDA bias beside CPU a and b is dispatched to the
// CUDA implementation, where a and b's dtype rule would blame a and b. The bias is
// one value per column of the output, in the dtype the device's implementation
// accumulates in (`bias_dtype`: torch.float32 on CUDA, torch.float64 on the CPU).
void checkContractWithBias(const std::string& op, const Tensor& a, const Tensor& b,
                           const Tensor& bias, ScalarType input_dtype, ScalarType bias_dtype,
                           bool kernel_rules) {
    require(bias.device() == a.device(), [&] {
        return joined(op, ": rule 'one device': bias must be on a's device; got a: ",
                      described(a), ", bias: ", described(bias));
    });
    checkContract(op, a, b, input_dtype, kernel_rules);
    require(bias.dim() == 1 && bias.size(0) == b.size(1), [&] {
        return joined(op, ": rule 'bias': bias must be 1-D with one value per column of b; ",
                      "got bias: ", described(bias), ", b: ", described(b));
    });
    require(bias.scalar_type() == bias_dtype, [&] {
        return joined(op, ": rule 'dtype': on ", deviceName(bias.device()), " bias must be ",
                      typeName(bias_dtype), "; got bias: ", described(bias));
    });
    require(bias.is_contiguous(), [&] {
        return joined(op, ": rule 'contiguous': bias must be contiguous; got bias: ",
                      described(bias), " with strides ", listed(bias.strides()));
    });
}

#ifdef DAY87_WITH_CUDA
// The caller's stream on `device_index`: the classic API's getCurrentCUDAStream, through
// the C function that AOTInductor's generated code calls too (declared under USE_CUDA).
cudaStream_t currentStream(int32_t device_index) {
    void* stream = nullptr;
    TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(device_index, &stream));
    return static_cast<cudaStream_t>(stream);
}

void requireLaunched(const std::string& op, cudaError_t status) {
    // Raise, never exit: std::exit would end the interpreter without a traceback.
    require(status == cudaSuccess,
            [&] { return op + ": launch failed: " + cudaGetErrorString(status); });
}

// wmma_mm and wmma_mm_bias share everything but the bias, nullptr for wmma_mm. The
// caller has checked the contract.
Tensor multiplyOnCuda(const std::string& op, const Tensor& a, const Tensor& b,
                      const float* bias) {
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);

    // The guard sets the current device to the tensors' device for the rest of
    // this scope and puts it back on the way out. Without it an operator called
    // on cuda:1 from a thread whose current device is 0 allocates on cuda:0.
    const torch::stable::accelerator::DeviceGuard guard(a.get_device_index());
    // A kernel forced by DAY87_FAST_KERNEL that this device cannot run is refused by name.
    const std::string switch_problem = tuned::kernelSwitchProblem();
    require(switch_problem.empty(), [&] { return op + ": " + switch_problem; });
    Tensor c = torch::stable::new_empty(a, {m, n}, ScalarType::Float);
    if (c.numel() == 0) return c;  // an empty result: there is nothing to launch
    // Where the grid of tiles is too small for the card, the launcher splits K and
    // adds the splits' partial sums, which need room: from PyTorch's caching
    // allocator, on this stream, so no cudaMalloc, no sync, and a CUDA graph can
    // capture the call. Usually none is needed and nothing is allocated.
    const size_t workspace_floats = tuned::fastGemmWorkspaceBytes(m, n, k) / sizeof(float);
    std::optional<Tensor> workspace;
    if (workspace_floats)
        workspace = torch::stable::new_empty(c, {static_cast<int64_t>(workspace_floats)});

    // The current stream, not a new one and not the default one. PyTorch orders
    // the caller's work on this stream; a kernel on any other would run beside
    // the kernels that produce a and b, with no dependency on them.
    requireLaunched(op, tuned::launchFastGemm(
        static_cast<const __half*>(a.const_data_ptr()),
        static_cast<const __half*>(b.const_data_ptr()), bias, c.mutable_data_ptr<float>(),
        static_cast<size_t>(m), static_cast<size_t>(n), static_cast<size_t>(k),
        workspace ? workspace->mutable_data_ptr<float>() : nullptr,
        currentStream(a.get_device_index())));
    return c;
}

Tensor wmmaMmCuda(const Tensor& a, const Tensor& b) {
    // every message names the operator that raised it
    const std::string op = "day87_fast::wmma_mm";
    checkContract(op, a, b, ScalarType::Half, /*kernel_rules=*/true);
    return multiplyOnCuda(op, a, b, nullptr);
}

Tensor wmmaMmBiasCuda(const Tensor& a, const Tensor& b, const Tensor& bias) {
    const std::string op = "day87_fast::wmma_mm_bias";
    checkContractWithBias(op, a, b, bias, ScalarType::Half, ScalarType::Float,
                          /*kernel_rules=*/true);
    return multiplyOnCuda(op, a, b, bias.const_data_ptr<float>());
}

// PyTorch's cuBLAS handle is shared by every library in the process: each mode changed here
// is put back on the way out, as the classic API's PointerModeGuard does for its one mode.
class HandleModes {
   public:
    HandleModes(cublasHandle_t handle, cublasPointerMode_t pointer_mode, cublasMath_t math_mode)
        : handle_(handle) {
        cublasGetPointerMode(handle, &saved_pointer_mode_);
        cublasGetMathMode(handle, &saved_math_mode_);
        cublasSetPointerMode(handle, pointer_mode);
        cublasSetMathMode(handle, math_mode);
    }
    ~HandleModes() {
        cublasSetMathMode(handle_, saved_math_mode_);
        cublasSetPointerMode(handle_, saved_pointer_mode_);
    }
    HandleModes(const HandleModes&) = delete;
    HandleModes& operator=(const HandleModes&) = delete;

   private:
    cublasHandle_t handle_;
    cublasPointerMode_t saved_pointer_mode_;
    cublasMath_t saved_math_mode_;
};

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
    require(rows <= INT_MAX && cols <= INT_MAX && depth <= INT_MAX, [&] {
        return joined(op, ": each size must fit cuBLAS's int; got ", rows, ", ", cols, " and ",
                      depth);
    });
    // PyTorch's handle for this device and thread, already bound to the current
    // stream and to a workspace from its caching allocator (so a CUDA graph can
    // capture the call).
    void* shared_handle = nullptr;
    TORCH_ERROR_CODE_CHECK(torch_get_current_cuda_blas_handle(&shared_handle));
    const auto handle = static_cast<cublasHandle_t>(shared_handle);
    // alpha is the scale kernel's output: read from device memory, it needs no sync.
    // Without the second flag cuBLAS may add a split K's partial sums in FP16, the output's
    // type; the products must be summed in FP32 and rounded once.
    const HandleModes modes(handle, CUBLAS_POINTER_MODE_DEVICE,
                            static_cast<cublasMath_t>(
                                CUBLAS_DEFAULT_MATH |
                                CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION));
    const int m = static_cast<int>(cols), n = static_cast<int>(rows), k = static_cast<int>(depth);
    // out^T = right^T @ left^T: cuBLAS's A is `right`, its B is `left`.
    const cublasStatus_t status = cublasGemmEx(
        handle, transpose_right ? CUBLAS_OP_T : CUBLAS_OP_N,
        transpose_left ? CUBLAS_OP_T : CUBLAS_OP_N,
        m, n, k, alpha_and_beta, right, CUDA_R_16F, transpose_right ? k : m, left, CUDA_R_16F,
        transpose_left ? n : k, alpha_and_beta + 1, out, CUDA_R_16F, m, CUBLAS_COMPUTE_32F,
        CUBLAS_GEMM_DEFAULT);
    require(status == CUBLAS_STATUS_SUCCESS,
            [&] { return op + ": cublasGemmEx failed: " + cublasGetStatusString(status); });
}

// The backward's products on tensor cores: grad_a = grad @ b^T where b is given and grad_b
// = a^T @ grad where a is given (the lesson's setup_context saves each input only when its
// partner needs a gradient), FP16, from an FP32 grad. fast/csrc/backward_version1_scaled.cu
// says why grad is scaled by a power of two first. One dispatcher call and three kernels
// (the scaling, two cuBLAS products): each op that autograd's backward thread issues costs
// tens of microseconds of host time, and the same work as twelve ATen ops made a small
// layer's step host-bound.
std::tuple<Tensor, Tensor> wmmaMmBackwardCuda(const Tensor& grad, std::optional<Tensor> a,
                                              std::optional<Tensor> b) {
    const std::string op = "day87_fast::wmma_mm_backward";
    require(grad.dim() == 2 && grad.scalar_type() == ScalarType::Float, [&] {
        return joined(op, ": grad must be a 2-D Float tensor; got ", described(grad));
    });
    for (const auto* input : {&a, &b})
        require(!input->has_value() || ((*input)->scalar_type() == ScalarType::Half &&
                                         (*input)->device() == grad.device() &&
                                         (*input)->is_contiguous()),
                [&] {
                    return joined(op, ": a and b must be contiguous Half on grad's device; got ",
                                  described(**input), " and grad ", described(grad));
                });
    require(!b.has_value() || (b->dim() == 2 && b->size(1) == grad.size(1)),
            [&] { return op + ": b must be K x N for an M x N grad"; });
    require(!a.has_value() || (a->dim() == 2 && a->size(0) == grad.size(0)),
            [&] { return op + ": a must be M x K for an M x N grad"; });
    require(!a.has_value() || !b.has_value() || a->size(1) == b->size(0), [&] {
        return joined(op, ": a must be M x K and b K x N with one K; got a: ", described(*a),
                      ", b: ", described(*b));
    });
    // A backward named by DAY87_FAST_BACKWARD that the package does not hold is refused.
    const std::string switch_problem = tuned::backwardSwitchProblem();
    require(switch_problem.empty(), [&] { return op + ": " + switch_problem; });
    const torch::stable::accelerator::DeviceGuard guard(grad.get_device_index());
    const cudaStream_t stream = currentStream(grad.get_device_index());
    const int64_t m = grad.size(0), n = grad.size(1);
    const int64_t k = b.has_value() ? b->size(0) : a.has_value() ? a->size(1) : 0;
    // A default-constructed Tensor is undefined, and reaches Python as None: no gradient for
    // that input.
    Tensor grad_a = b.has_value() ? torch::stable::new_empty(*b, {m, k}) : Tensor();
    Tensor grad_b = a.has_value() ? torch::stable::new_empty(*a, {k, n}) : Tensor();
    if (grad.numel() == 0) {  // no sums to scale: each product is empty or all zeros
        for (auto* out : {&grad_a, &grad_b})
            if (out->defined()) torch::stable::zero_(*out);
        return {grad_a, grad_b};
    }
    const auto input = [](const Tensor& t) {
        return static_cast<const __half*>(t.const_data_ptr());
    };
    const auto output = [](const Tensor& t) {
        return t.defined() ? static_cast<__half*>(t.mutable_data_ptr()) : nullptr;
    };
    // From PyTorch's caching allocator, on this stream: no cudaMalloc, no sync, and
    // safe inside a CUDA graph capture. The last two floats are cuBLAS's alpha and beta.
    Tensor workspace = torch::stable::new_empty(grad, {tuned::kMaxHelperBlocks + 2});
    float* alpha_and_beta = workspace.mutable_data_ptr<float>() + tuned::kMaxHelperBlocks;
    Tensor scaled = torch::stable::new_empty(grad, {m, n}, ScalarType::Half);
    requireLaunched(op, tuned::launchScaleToHalf(
        grad.const_data_ptr<float>(), m, n, grad.stride(0), grad.stride(1), output(scaled),
        alpha_and_beta, workspace.mutable_data_ptr<float>(), stream));
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
Tensor wmmaMmCpu(const Tensor& a, const Tensor& b) {
    checkContract("day87_fast::wmma_mm", a, b, ScalarType::Double, /*kernel_rules=*/false);
    return torch::stable::matmul(a, b);
}

Tensor wmmaMmBiasCpu(const Tensor& a, const Tensor& b, const Tensor& bias) {
    checkContractWithBias("day87_fast::wmma_mm_bias", a, b, bias, ScalarType::Double,
                          ScalarType::Double, /*kernel_rules=*/false);
    Tensor c = torch::stable::new_empty(a, {a.size(0), b.size(1)});
    // c = 1 * bias + 1 * (a @ b), bias broadcast down the rows.
    TORCH_ERROR_CODE_CHECK(aoti_torch_cpu_addmm_out(c.get(), bias.get(), a.get(), b.get(),
                                                    /*beta=*/1.0, /*alpha=*/1.0));
    return c;
}

}  // namespace

// The registrations. TORCH_BOX wraps each function in the boxed calling convention that
// the stable ABI passes through its C interface (the classic API's m.impl does this
// itself, with C++ templates compiled against one libtorch).
STABLE_TORCH_LIBRARY(day87_fast, m) {
    m.def("wmma_mm(Tensor a, Tensor b) -> Tensor");
    m.def("wmma_mm_bias(Tensor a, Tensor b, Tensor bias) -> Tensor");
    m.def("wmma_mm_backward(Tensor grad, Tensor? a, Tensor? b) -> (Tensor, Tensor)");
}

#ifdef DAY87_WITH_CUDA
STABLE_TORCH_LIBRARY_IMPL(day87_fast, CUDA, m) {
    m.impl("wmma_mm", TORCH_BOX(&wmmaMmCuda));
    m.impl("wmma_mm_bias", TORCH_BOX(&wmmaMmBiasCuda));
    m.impl("wmma_mm_backward", TORCH_BOX(&wmmaMmBackwardCuda));
}
#endif

STABLE_TORCH_LIBRARY_IMPL(day87_fast, CPU, m) {
    m.impl("wmma_mm", TORCH_BOX(&wmmaMmCpu));
    m.impl("wmma_mm_bias", TORCH_BOX(&wmmaMmBiasCpu));
}
