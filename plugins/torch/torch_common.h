// Helpers shared by the PyTorch bindings: tensors -> shapes and raw pointers, core Status -> TORCH_CHECK,
// and the execution contexts (ATen's thread pool and GEMM on the CPU; the current stream and ATen's
// GEMM on CUDA). Nothing here knows an operator.
#pragma once

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <atomic>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/op_decl.h"

#ifdef DCNKIT_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#endif

namespace dcnkit::torch_binding {

inline Shape shape_of(const at::Tensor& t) { return Shape(t.sizes().begin(), t.sizes().end()); }

// Raises the core's message as a c10::Error (ValueError in Python for invalid arguments).
inline void throw_if_error(const Status& s) {
  if (s.ok()) return;
  if (s.code() == StatusCode::kInvalidArgument) {
    TORCH_CHECK_VALUE(false, s.message());
  }
  TORCH_CHECK(false, s.message());
}

inline DType dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kDouble: return DType::kFloat64;
    case at::kHalf: return DType::kFloat16;
    case at::kBFloat16: return DType::kBFloat16;
    default: break;
  }
  TORCH_CHECK_TYPE(false, "unsupported dtype ", t.scalar_type());
  return DType::kFloat32;
}

// Checks that `t` is a floating tensor on `device` with dtype `dtype` (naming the argument).
inline void check_tensor(const char* op, const char* arg, const at::Tensor& t,
                         const at::Tensor& like) {
  TORCH_CHECK_VALUE(t.device() == like.device(), op, ": ", arg, ": expected a tensor on ",
                    like.device(), " (the device of input), got ", t.device());
  TORCH_CHECK_TYPE(t.scalar_type() == like.scalar_type(), op, ": ", arg, ": expected dtype ",
                   like.scalar_type(), " (the dtype of input), got ", t.scalar_type());
}

// Checks the dtypes a device supports: float32/float64 everywhere; float16/bfloat16 on the CPU (computed in
// float32, see computes_in_float32) and on CUDA, forward and backward (the CUDA backward accumulates 16-bit
// gradients in float32).
inline void check_dtype_supported(const char* op, const at::Tensor& input, [[maybe_unused]] bool backward) {
  const auto st = input.scalar_type();
  const bool base = st == at::kFloat || st == at::kDouble;
  const bool half = st == at::kHalf || st == at::kBFloat16;
  const bool ok = base || half;
  TORCH_CHECK_TYPE(ok, op, ": input: expected dtype ",
                   input.is_cuda() ? "float32, float64, float16 or bfloat16 (CUDA)"
                                   : "float32, float64, float16 or bfloat16 (CPU)",
                   ", got ", st);
}

// Checks a supported dtype of input, then every other given tensor on input's device with input's dtype.
inline void check_inputs(const char* op, const at::Tensor& input, bool backward,
                         std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  check_dtype_supported(op, input, backward);
  for (const auto& o : others) {
    if (o.second != nullptr && o.second->defined()) check_tensor(op, o.first, *o.second, input);
  }
}

// CPU float16 / bfloat16: the op converts its tensors to float32 at its boundary, runs the float32 CPU
// kernels and returns its results in the input's dtype (no reduced-precision kernel math on the CPU).
inline bool computes_in_float32(const at::Tensor& input) {
  return input.is_cpu() && (input.scalar_type() == at::kHalf || input.scalar_type() == at::kBFloat16);
}
inline at::Tensor to_float32(const at::Tensor& t) { return t.defined() ? t.to(at::kFloat) : t; }
inline std::optional<at::Tensor> to_float32(const std::optional<at::Tensor>& t) {
  if (!t.has_value() || !t->defined()) return t;
  return t->to(at::kFloat);
}

inline at::Tensor contiguous_or_undefined(const std::optional<at::Tensor>& t) {
  return (t.has_value() && t->defined()) ? t->contiguous() : at::Tensor();
}

template <typename T>
inline const T* ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.const_data_ptr<T>() : nullptr;
}
template <typename T>
inline T* mut_ptr_or_null(const at::Tensor& t) {
  return t.defined() ? t.mutable_data_ptr<T>() : nullptr;
}
inline const void* vptr_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }
inline void* mut_vptr_or_null(const at::Tensor& t) { return t.defined() ? t.mutable_data_ptr() : nullptr; }

// GEMM through ATen on tensors wrapping the raw pointers (CPU or CUDA, any dtype ATen supports).
Status aten_gemm(void* device_options, const GemmArgs& g);

// ATen's intra-op thread pool and GEMM.
CpuContext cpu_context();
// The same with the GEMM straight through the BLAS libtorch_cpu exports, and oneDNN's on packed operands
// (torch_blas.cpp): the ops' CPU context; `packed`: the call has a packed operand (its tiles widened for it).
CpuContext fast_cpu_context(bool packed = false);

// The float32 inputs of a CPU call that its launcher takes in its own layout as a GEMM operand (OpEntry::pack,
// gemm_operand: DeformConv2d's weight), packed for oneDNN's matmul for this call, into `packs` (which must outlive
// the call; the launcher's layout stays in the calling thread's buffer, valid until its next call) and b->packed /
// gemm_packed, where the call has at least DCNKIT_PACK_MIN_COLUMNS (192) output positions per weight row; false when
// nothing was packed (oneDNN 3.x absent, DCNKIT_NO_PACKED_GEMM set, too few columns).
struct CpuPacks {
  std::shared_ptr<const void> gemm[kMaxInputs];
};
bool pack_cpu_operands(const OpEntry& e, const OpCall& c, DType dtype, OpBuffers* b, CpuPacks* packs);
// The calls pack_cpu_operands packed for, so far.
extern std::atomic<int64_t> packed_calls;
// What pack_cpu_operands packs for: "oneDNN <version> (<library>)", or "libtorch BLAS (<why not>)".
std::string cpu_gemm_in_use();

// Workspace of `bytes` bytes on the device of `like` (kept alive by the returned tensor).
inline at::Tensor workspace_for(const at::Tensor& like, size_t bytes) {
  return at::empty({static_cast<int64_t>(bytes)}, like.options().dtype(at::kByte));
}

#ifdef DCNKIT_WITH_CUDA
// The current CUDA stream of `like`'s device and ATen's GEMM on it.
CudaContext cuda_context(const at::Tensor& like);
#endif

// The CUDA backward kernels without an atomic-free path for a call (OpEntry::deterministic) scatter gradients with
// atomic adds, so the order of the additions (the last bits of the result) can differ between runs. Under
// torch.use_deterministic_algorithms(True) this raises torch's standard "does not have a deterministic
// implementation" error (a warning with warn_only=True), as torch's own atomic-add kernels do. The CPU kernels are
// deterministic (disjoint writes, fixed order per thread count).
inline void alert_atomic_cuda_backward(const char* op, const at::Tensor& input) {
  if (input.is_cuda()) at::globalContext().alertNotDeterministic(std::string("dcnkit::") + op + " (CUDA)");
}

}  // namespace dcnkit::torch_binding

