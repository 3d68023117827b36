// dcnkit core: shared definitions for every operator and every front end.
//
// The core knows no framework. Front ends (PyTorch, ONNX Runtime, TensorRT) describe tensors by their
// shapes, fill an op's params struct through its `make_*_params` function (which validates everything
// once), size a workspace with `*_workspace_size`, and call a launcher with raw pointers.
// Errors come back as a Status whose message names the argument, the expected and the actual value;
// each front end re-raises that message in its own error type.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <cstdio>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__CUDACC__)
#define DCNKIT_HD __host__ __device__ __forceinline__
#else
#define DCNKIT_HD inline
#endif

namespace dcnkit {

// A value in a per-thread shared-memory slot that the kernels read at each use: volatile on the device (nothing hoisted
// into registers: the 48-register budget of the RoI kernels), the plain type on the host (the CPU schedule tests).
#if defined(__CUDA_ARCH__)
template <typename V>
using DeviceVolatile = volatile V;
#else
template <typename V>
using DeviceVolatile = V;
#endif

// ---------------------------------------------------------------------------------------------
// Limits

// The largest explicit sampling grid per bin and axis: RoIAlign's and DeformRoIPool's sampling_ratio,
// DeformPSRoIPool's sample_per_part (every front end rejects a larger value, naming the argument). Far
// above any trained model's (0, 2 or 4 in practice), it bounds the work of a bin to 1024^2 samples;
// adaptive grids (sampling_ratio <= 0) are bounded by the map size instead (roi_kernels.h).
// python/dcnkit/ops/roi_ops.py mirrors it as MAX_SAMPLING_RATIO.
constexpr int64_t kMaxSamplingRatio = 1024;

// ---------------------------------------------------------------------------------------------
// Status

enum class StatusCode : int { kOk = 0, kInvalidArgument = 1, kDeviceError = 2, kInternal = 3 };

class Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }
  static Status Invalid(std::string message) {
    return Status(StatusCode::kInvalidArgument, std::move(message));
  }
  static Status DeviceError(std::string message) {
    return Status(StatusCode::kDeviceError, std::move(message));
  }
  static Status Internal(std::string message) {
    return Status(StatusCode::kInternal, std::move(message));
  }
  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

#define DCNKIT_RETURN_IF_ERROR(expr)          \
  do {                                        \
    ::dcnkit::Status _dcnkit_status = (expr); \
    if (!_dcnkit_status.ok()) return _dcnkit_status; \
  } while (0)

// ---------------------------------------------------------------------------------------------
// Shapes and error messages

using Shape = std::vector<int64_t>;

// Messages are formatted without iostreams (std::to_string, snprintf): a torch 2.11 build on an H200 machine
// (gcc 13) crashed in the first `ostringstream << int64_t` of a call (2026-11-28), and these need no locale.
inline std::string shape_str(const Shape& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

// A number as ostream's default format writes it: integers in full, floating values as %g (6 significant digits,
// nan, inf, -inf).
template <typename T>
inline std::string to_str(const T& v) {
  if constexpr (std::is_integral_v<T>) {
    return std::to_string(v);
  } else {
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));
    return buf;
  }
}

// The one message format of the project: "<op>: <argument>: expected <expected>, got <actual>".
inline Status arg_error(const char* op, const std::string& arg, const std::string& expected,
                        const std::string& actual) {
  return Status::Invalid(std::string(op) + ": " + arg + ": expected " + expected + ", got " + actual);
}

// Checks that `shape` has `rank` dimensions.
inline Status check_rank(const char* op, const char* arg, const Shape& shape, size_t rank,
                         const char* layout) {
  if (shape.size() != rank) {
    return arg_error(op, arg, std::to_string(rank) + "-D tensor " + layout,
                     std::to_string(shape.size()) + "-D tensor of shape " + shape_str(shape));
  }
  return Status::Ok();
}

// Checks shape[dim] == value.
inline Status check_dim(const char* op, const char* arg, const Shape& shape, size_t dim,
                        int64_t value, const std::string& what) {
  if (shape[dim] != value) {
    return arg_error(op, arg, "size " + std::to_string(value) + " at dim " + std::to_string(dim) +
                                  " (" + what + ")",
                     std::to_string(shape[dim]) + " (shape " + shape_str(shape) + ")");
  }
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// Element types (the front ends map theirs onto these; half and bfloat16 are IEEE binary16 and
// bfloat16 bit layouts, identical in CUDA, ATen, ONNX Runtime and TensorRT).

enum class DType : int { kFloat32 = 0, kFloat64 = 1, kFloat16 = 2, kBFloat16 = 3 };

inline const char* dtype_name(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat64: return "float64";
    case DType::kFloat16: return "float16";
    case DType::kBFloat16: return "bfloat16";
  }
  return "unknown";
}

inline size_t dtype_size(DType t) {
  return (t == DType::kFloat64) ? 8 : (t == DType::kFloat32) ? 4 : 2;
}

// ---------------------------------------------------------------------------------------------
// GEMM, provided by the front end (ATen, OpenBLAS, cuBLAS): strided-batched, row-major.
//   for b in [0, batch): C_b[m, n] = alpha * op(A_b)[m, k] * op(B_b)[k, n] + beta * C_b[m, n]
// with A_b = a + b * stride_a (elements), op(X) = X^T when trans_x. Leading dimensions are row-major
// (the distance in elements between consecutive rows of the matrix as stored).

struct GemmArgs {
  DType dtype = DType::kFloat32;
  bool trans_a = false;
  bool trans_b = false;
  int64_t m = 0, n = 0, k = 0;
  float alpha = 1.f, beta = 0.f;
  const void* a = nullptr;
  int64_t lda = 0;
  int64_t stride_a = 0;
  const void* b = nullptr;
  int64_t ldb = 0;
  int64_t stride_b = 0;
  void* c = nullptr;
  int64_t ldc = 0;
  int64_t stride_c = 0;
  int64_t batch = 1;
  // Optional (CPU): A packed once by the front end's GEMM (a GemmOperand made by it, opaque here), op(A_b) being rows
  // [a_row0, a_row0 + m) of its matrix b, untransposed; a_row0 a multiple of kPackedRowBlock, a_row0 + m one too or
  // the last row. `a`, lda and stride_a still describe the same matrix, for a GEMM that does not use it.
  const void* a_packed = nullptr;
  int64_t a_row0 = 0;
};

// A GEMM's left operand that stays the same over many GEMMs (a constant weight): `batch` row-major matrices of
// rows x cols (row stride ld, matrix stride `stride`, elements), which a CPU front end's GEMM may pack once into its
// own layout and then take as GemmArgs::a_packed.
struct GemmOperand {
  DType dtype = DType::kFloat32;
  int64_t batch = 1, rows = 0, cols = 0, ld = 0, stride = 0;
  const void* data = nullptr;
};

// The row granularity of a packed GemmOperand: a GEMM on it starts at a multiple of this many rows.
constexpr int64_t kPackedRowBlock = 64;

using GemmFn = Status (*)(void* self, const GemmArgs& args);

}  // namespace dcnkit
