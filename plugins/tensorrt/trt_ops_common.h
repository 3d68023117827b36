// Helpers of the per-operator plugin files (trt_ops*.cpp): the core's shape rules over TensorRT's dimension
// expressions, rank checks, params from canonical inputs, per-dimension maxima and the CUDA context.
#pragma once

#include <string>

#include "trt_plugin.h"

namespace dcnkit::trt {

// The core's shape rules evaluated on TensorRT's symbolic dimensions (see deform_conv2d_out_size_rule).
struct ExprArith {
  nvinfer1::IExprBuilder& b;
  using Value = const nvinfer1::IDimensionExpr*;
  Value op(nvinfer1::DimensionOperation o, Value x, Value y) const {
    return (x != nullptr && y != nullptr) ? b.operation(o, *x, *y) : nullptr;
  }
  Value constant(int64_t v) const { return b.constant(v); }
  Value add(Value x, Value y) const { return op(nvinfer1::DimensionOperation::kSUM, x, y); }
  Value sub(Value x, Value y) const { return op(nvinfer1::DimensionOperation::kSUB, x, y); }
  Value mul(Value x, Value y) const { return op(nvinfer1::DimensionOperation::kPROD, x, y); }
  Value floor_div(Value x, Value y) const { return op(nvinfer1::DimensionOperation::kFLOOR_DIV, x, y); }
};

inline Status need_rank(const char* op, const char* arg, const nvinfer1::DimsExprs* d, int32_t rank) {
  if (d == nullptr) return arg_error(op, arg, "a tensor", "no input");
  if (d->nbDims != rank) {
    return arg_error(op, arg, std::to_string(rank) + "-D tensor", std::to_string(d->nbDims) + "-D tensor");
  }
  return Status::Ok();
}

template <typename Params>
Status params_of(const OpVariant& v, const OpAttrs& a, const CanonicalInputs& in, Params* p) {
  return make_params(v.op_type, a, in.shapes, p);
}

inline CudaContext cuda_context(cudaStream_t stream) {
  CudaContext ctx;
  ctx.stream = stream;
  return ctx;
}

// Dim d of a canonical input's (max) shape; 0 when absent or of a lower rank.
inline int64_t dim(const CanonicalInputs& in, int c, size_t d) {
  const Shape* s = in.shapes[c];
  return s != nullptr && d < s->size() && (*s)[d] > 0 ? (*s)[d] : 0;
}

}  // namespace dcnkit::trt
