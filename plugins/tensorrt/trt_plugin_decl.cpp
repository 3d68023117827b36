// The plugin's calls into the op's declaration (dcnkit/op_decl.h): output dims over TensorRT's dimension expressions,
// the checks of a call, the workspace, and the enqueue through the op's CUDA entry point. No op named.
#include "dcnkit/cublas_gemm.h"
#include "trt_blas.h"
#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {

namespace {

// TensorRT's dimension expressions as the core's DimArith (the declarations' output rules).
class ExprArith final : public DimArith {
 public:
  explicit ExprArith(IExprBuilder& b) : b_(b) {}
  Value constant(int64_t v) override { return b_.constant(v); }
  Value add(Value x, Value y) override { return op(DimensionOperation::kSUM, x, y); }
  Value sub(Value x, Value y) override { return op(DimensionOperation::kSUB, x, y); }
  Value mul(Value x, Value y) override { return op(DimensionOperation::kPROD, x, y); }
  Value floor_div(Value x, Value y) override { return op(DimensionOperation::kFLOOR_DIV, x, y); }
  Value either(Value x, Value y) override {
    const auto constant = [](Value v) { return v != nullptr && static_cast<const IDimensionExpr*>(v)->isConstant(); };
    return !constant(x) && constant(y) ? y : x;
  }

 private:
  Value op(DimensionOperation o, Value x, Value y) {
    return x != nullptr && y != nullptr
               ? b_.operation(o, *static_cast<const IDimensionExpr*>(x), *static_cast<const IDimensionExpr*>(y))
               : nullptr;
  }
  IExprBuilder& b_;
};

OpTypes op_types(const TensorTypes& t) {
  OpTypes o;
  o.dtype = t.features;
  o.rois = t.rois;
  o.int32_index = t.int32_index;
  return o;
}

}  // namespace

OpCall PluginBase::call(const CanonicalInputs& in) const {
  OpShapes shapes;
  for (size_t i = 0; i < kMaxInputs; ++i) shapes.in[i] = in.shapes[i];
  shapes.variadic = in.variadic_shape;
  return op_call(attrs_, shapes);
}

Status PluginBase::output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const {
  const OpEntry& e = variant_->op->entry;
  if (e.output_dims == nullptr) return Status::Internal("the op declares no output dims");
  OpDims d;
  DimArith::Value values[kMaxInputs][Dims::MAX_DIMS] = {};
  for (size_t c = 0; c < kMaxInputs; ++c) {
    if (in[c] == nullptr) continue;
    d.rank[c] = in[c]->nbDims;
    for (int32_t k = 0; k < in[c]->nbDims && k < Dims::MAX_DIMS; ++k) values[c][k] = in[c]->d[k];
    d.in[c] = values[c];
  }
  ExprArith arith(b);
  DCNKIT_RETURN_IF_ERROR(e.output_dims(call(CanonicalInputs()), arith, &d));
  for (int32_t o = 0; o < getNbOutputs(); ++o) {
    out[o].nbDims = d.out_rank[o];
    for (int32_t k = 0; k < d.out_rank[o]; ++k) {
      out[o].d[k] = static_cast<const IDimensionExpr*>(d.out[o][k]);
      if (out[o].d[k] == nullptr) return Status::Internal("IExprBuilder failed");
    }
  }
  return Status::Ok();
}

Status PluginBase::check(const CanonicalInputs& in) const {
  Shape out[kMaxOutputs];
  return variant_->op->entry.outputs(call(in), out);
}

size_t PluginBase::workspace_bound(const CanonicalInputs& max_in, const TensorTypes& t) const {
  const OpEntry& e = variant_->op->entry;
  return e.workspace_bound != nullptr ? e.workspace_bound(call(max_in), op_types(t)) : 0;
}

size_t PluginBase::workspace_needed(const CanonicalInputs& in, const TensorTypes& t) const {
  const OpEntry& e = variant_->op->entry;
  const CudaContext ctx;
  OpDevice dev;
  dev.cuda = &ctx;
  return e.workspace != nullptr ? e.workspace(call(in), Pass::kForward, op_types(t), dev) : 0;
}

Status PluginBase::run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* workspace,
                       cudaStream_t stream) {
  const OpEntry& e = variant_->op->entry;
  if (e.forward_cuda == nullptr) return Status::Internal("no CUDA kernel for this op");
  OpBuffers b;
  for (size_t i = 0; i < kMaxInputs; ++i) b.in[i] = in.data[i];
  b.variadic = in.variadic_data;
  for (int32_t o = 0; o < getNbOutputs(); ++o) b.out[o] = outputs[o];
  b.workspace = workspace;
  CudaContext ctx;
  ctx.stream = stream;
  if (needs_blas()) {
    gemm_->stream = stream;  // enqueue attached a handle (attachToContext, or its own on the first enqueue)
    ctx.gemm = &cublas_gemm;
    ctx.gemm_self = gemm_;
  }
  OpDevice dev;
  dev.cuda = &ctx;
  return e.forward_cuda(call(in), op_types(t), b, dev);
}

PluginBase* make_plugin(const OpVariant* variant, const OpAttrs& attrs, const std::string& name) {
  return new PluginBase(variant, attrs, name);
}

}  // namespace dcnkit::trt
