// binding.cpp: registers day87::wmma_mm with PyTorch's dispatcher.
//
// In order: the input contract, then the schema, and two implementations with their
// registrations: CUDA (the WMMA kernel in kernel.cu) and CPU (float64, so gradcheck
// can differentiate the forward numerically). op.py builds this file at import and
// adds the two registrations that live in Python: the fake implementation and the
// backward formula.
//
// op.py defines DAY87_WITH_CUDA when it builds kernel.cu beside this file; without
// it (a CPU-only torch, or no nvcc) the CUDA half compiles out.

#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstdint>
#include <string>

#ifdef DAY87_WITH_CUDA
// The device guard and the current stream. ATen/cuda/CUDAContext.h would give
// these too, but it pulls in cuBLAS's headers, which a minimal toolkit lacks.
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

// Defined in kernel.cu, with the tile that the shape must divide. A declaration that
// differs from its definition still compiles and links; the library then fails to
// load on an undefined symbol. Change the two together.
cudaError_t launchWmmaGemm(const __half* a, const __half* b, float* c, size_t m, size_t n,
                           size_t k, cudaStream_t stream);
extern const int kTileM, kTileN, kTileK;
#endif

namespace {

// What a message shows of a tensor: "[256, 512] Half on cuda:0" (op.py's described()).
std::string described(const at::Tensor& t) {
    return c10::str(t.sizes(), " ", t.scalar_type(), " on ", t.device());
}

// The input contract. Each failure is a TORCH_CHECK: a Python RuntimeError that
// names the rule and the values it saw, never a crash and never a silent copy.
// `op` names the operator in every message (the exercise's passes its own name);
// `input_dtype` is what the device's implementation computes in; `tile_rules` adds
// what the CUDA kernel needs and the CPU reference does not.
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
    TORCH_CHECK(a.size(0) % kTileM == 0 && b.size(1) % kTileN == 0 && a.size(1) % kTileK == 0,
                op, ": rule 'tile': M, N and K must be multiples of ", kTileM, ", ", kTileN,
                " and ", kTileK, "; got M=", a.size(0), ", N=", b.size(1), ", K=", a.size(1));
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

}  // namespace

// The schema is the operator's public type: the dispatcher, autograd and the
// compiler read it. No `!` annotations: the op neither mutates nor aliases an input.
TORCH_LIBRARY(day87, m) {
    m.def("wmma_mm(Tensor a, Tensor b) -> Tensor");
}

namespace {

#ifdef DAY87_WITH_CUDA
at::Tensor wmmaMmCuda(const at::Tensor& a, const at::Tensor& b) {
    const std::string op = "day87::wmma_mm";  // every message names the operator that raised it
    checkContract(op, a, b, at::kHalf, /*tile_rules=*/true);
    const int64_t m = a.size(0), k = a.size(1), n = b.size(1);

    // The guard sets the current device to the tensors' device for the rest of
    // this scope and puts it back on the way out. Without it an operator called
    // on cuda:1 from a thread whose current device is 0 allocates on cuda:0.
    const c10::cuda::CUDAGuard guard(a.device());
    at::Tensor c = at::empty({m, n}, a.options().dtype(at::kFloat));

    // The current stream, not a new one and not the default one. PyTorch orders
    // the caller's work on this stream; a kernel on any other would run beside
    // the kernels that produce a and b, with no dependency on them.
    const cudaError_t status = launchWmmaGemm(
        reinterpret_cast<const __half*>(a.const_data_ptr<at::Half>()),
        reinterpret_cast<const __half*>(b.const_data_ptr<at::Half>()), c.mutable_data_ptr<float>(),
        static_cast<size_t>(m), static_cast<size_t>(n), static_cast<size_t>(k),
        c10::cuda::getCurrentCUDAStream(a.device().index()).stream());
    // Raise, never exit: std::exit would end the interpreter without a traceback.
    TORCH_CHECK(status == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(status));
    return c;
}
#endif

// The reference path. It exists so that gradcheck has a forward it can perturb
// numerically: in FP16 a central difference is mostly rounding, in float64 it is not.
at::Tensor wmmaMmCpu(const at::Tensor& a, const at::Tensor& b) {
    checkContract("day87::wmma_mm", a, b, at::kDouble, /*tile_rules=*/false);
    return at::mm(a, b);
}

}  // namespace

#ifdef DAY87_WITH_CUDA
TORCH_LIBRARY_IMPL(day87, CUDA, m) {
    m.impl("wmma_mm", &wmmaMmCuda);
}
#endif

TORCH_LIBRARY_IMPL(day87, CPU, m) {
    m.impl("wmma_mm", &wmmaMmCpu);
}
