// The multi-scale deformable attention plugin: dcnkit's MultiScaleDeformableAttention, mmdeploy's
// MMCVMultiScaleDeformableAttention (output (N, Lq, M*D)) and TensorRT's MultiscaleDeformableAttnPlugin_TRT (the
// same inputs, output (N, Lq, M, D): the same memory). The level tables arrive as int64 (the kit's exporter,
// mmdeploy's ONNX) or int32 (TensorRT's plugin and mmdeploy's TensorRT plugin take int32): int32 tables are widened
// into the workspace (msda_levels_to_int64_cuda) before the core's forward launcher, which reads int64 tables on
// the device. No fields.
#include <algorithm>
#include <cstdint>

#include "trt_ops_common.h"

using namespace nvinfer1;

namespace dcnkit::trt {

namespace {

class MsdaPlugin final : public PluginBase {
 public:
  using PluginBase::PluginBase;

 protected:
  PluginBase* make_copy() const override { return new MsdaPlugin(*this); }

  Status output_shapes(const DimsExprs* const* in, IExprBuilder& b, DimsExprs* out) const override {
    const char* op = variant_->op_type;
    DCNKIT_RETURN_IF_ERROR(need_rank(op, "value", in[kMsdaValue], 4));
    DCNKIT_RETURN_IF_ERROR(need_rank(op, "sampling_locations", in[kMsdaLocations], 6));
    const DimsExprs& value = *in[kMsdaValue];  // (N, S, M, D)
    out[0].d[0] = value.d[0];
    out[0].d[1] = in[kMsdaLocations]->d[1];  // Lq
    if (variant_->per_head_output) {
      out[0].nbDims = 4;
      out[0].d[2] = value.d[2];
      out[0].d[3] = value.d[3];
      return Status::Ok();
    }
    out[0].nbDims = 3;
    out[0].d[2] = ExprArith{b}.mul(value.d[2], value.d[3]);
    return out[0].d[2] != nullptr ? Status::Ok() : Status::Internal("IExprBuilder failed");
  }

  Status check(const CanonicalInputs& in) const override {
    MsdaParams p;
    return params_of(*variant_, attrs_, in, &p);
  }

  // Only int32 tables need workspace: their int64 copies, 3 L values; L from either table's maxima.
  size_t workspace_bound(const CanonicalInputs& max_in, const TensorTypes& t) const override {
    if (!t.int32_index) return 0;
    MsdaParams p;
    p.num_levels = std::max(dim(max_in, kMsdaSpatialShapes, 0), dim(max_in, kMsdaLevelStart, 0));
    return msda_int32_levels_workspace_cuda(p);
  }

  size_t workspace_needed(const CanonicalInputs& in, const TensorTypes& t) const override {
    MsdaParams p;
    return t.int32_index && params_of(*variant_, attrs_, in, &p).ok() ? msda_int32_levels_workspace_cuda(p) : 0;
  }

  Status run(const CanonicalInputs& in, const TensorTypes& t, void* const* outputs, void* ws,
             cudaStream_t stream) override {
    MsdaParams p;
    DCNKIT_RETURN_IF_ERROR(params_of(*variant_, attrs_, in, &p));
    const CudaContext ctx = cuda_context(stream);
    const auto* shapes = static_cast<const int64_t*>(in.data[kMsdaSpatialShapes]);
    const auto* starts = static_cast<const int64_t*>(in.data[kMsdaLevelStart]);
    if (t.int32_index) {
      DCNKIT_RETURN_IF_ERROR(msda_levels_to_int64_cuda(p, static_cast<const int32_t*>(in.data[kMsdaSpatialShapes]),
                                                       static_cast<const int32_t*>(in.data[kMsdaLevelStart]), ws,
                                                       ctx, &shapes, &starts));
    }
    return msda_forward_cuda(p, t.features, in.data[kMsdaValue], shapes, starts, in.data[kMsdaLocations],
                             in.data[kMsdaWeights], outputs[0], ctx);
  }
};

}  // namespace

PluginBase* make_msda_plugin(const OpVariant* variant, const OpAttrs& attrs, const std::string& name) {
  return new MsdaPlugin(variant, attrs, name);
}

}  // namespace dcnkit::trt
