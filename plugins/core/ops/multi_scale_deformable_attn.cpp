// The declaration of MultiScaleDeformableAttention (see op_decl.h): what every adapter knows of it.
#include <algorithm>

#include "dcnkit/msda.h"
#include "dcnkit/op_decl.h"

namespace dcnkit {
namespace {

// Inputs in mmcv's order (MultiScaleDeformableAttnFunction, mmdeploy's MMCVMultiScaleDeformableAttention, TensorRT's
// MultiscaleDeformableAttnPlugin_TRT). No attributes: mmcv's im2col_step only batches its CUDA work and does not
// change the result; a node's im2col_step attribute is ignored.
constexpr TensorDef kInputs[] = {
    TensorDef{"value", false, "(N, S, M, D), S = sum of H_l*W_l"}.with_grad(),
    TensorDef{"spatial_shapes", false, "(L, 2) int64 rows (H_l, W_l)"}.as_index(),
    TensorDef{"level_start_index", false, "(L) int64, first row of each level in value"}.as_index(),
    TensorDef{"sampling_locations", false, "(N, Lq, M, L, P, 2) as (x, y) in [0, 1]"}.with_grad().cast_to_first(),
    TensorDef{"attention_weights", false, "(N, Lq, M, L, P)"}.with_grad().cast_to_first(),
};
constexpr TensorDef kOutputs[] = {TensorDef{"output", false, "(N, Lq, M*D)"}.with_grad()};
constexpr int kValue = DCNKIT_INDEX(kInputs, "value"), kShapes = DCNKIT_INDEX(kInputs, "spatial_shapes"),
              kStarts = DCNKIT_INDEX(kInputs, "level_start_index"),
              kLocations = DCNKIT_INDEX(kInputs, "sampling_locations"),
              kWeights = DCNKIT_INDEX(kInputs, "attention_weights");

const int64_t* table(const OpBuffers& b, int i) { return static_cast<const int64_t*>(b.in[i]); }

// No value or no sampling point: every gradient is 0 (the buffers arrive zeroed).
bool empty(const MsdaParams& p) {
  return p.batch * p.num_values * p.heads * p.channels == 0 ||
         p.batch * p.num_queries * p.heads * p.num_levels * p.num_points == 0;
}

struct Op {
  using Params = MsdaParams;

  static Status params(const OpCall& c, Params* p) {
    const OpShapes& s = c.shapes;
    return make_msda_params(c.op, *s.in[kValue], *s.in[kShapes], *s.in[kStarts], *s.in[kLocations], *s.in[kWeights],
                            p);
  }
  // TensorRT's MultiscaleDeformableAttnPlugin_TRT writes (N, Lq, M, D): the same memory.
  static void outputs(const OpCall& c, const Params& p, Shape* out) {
    out[0] = c.variant != nullptr && c.variant->per_head_output ? p.per_head_output_shape() : p.output_shape();
  }
  static Status output_dims(const OpCall& c, DimArith& a, OpDims* d) {
    if (d->rank[kValue] != 4) return arg_error(c.op, "value", "4-D tensor", std::to_string(d->rank[kValue]) + "-D");
    if (d->rank[kLocations] != 6) {
      return arg_error(c.op, "sampling_locations", "6-D tensor", std::to_string(d->rank[kLocations]) + "-D");
    }
    const DimArith::Value* value = d->in[kValue];  // (N, S, M, D)
    d->out[0][0] = value[0];
    d->out[0][1] = d->in[kLocations][1];  // Lq
    if (c.variant != nullptr && c.variant->per_head_output) {
      d->out_rank[0] = 4;
      d->out[0][2] = value[2];
      d->out[0][3] = value[3];
    } else {
      d->out_rank[0] = 3;
      d->out[0][2] = a.mul(value[2], value[3]);
    }
    return Status::Ok();
  }
  // int32 level tables (TensorRT) are widened into the workspace; the backward's 16-bit accumulation.
  static size_t workspace_cuda(const Params& p, Pass pass, const OpTypes& t, const CudaContext&) {
    if (pass == Pass::kBackward) return msda_backward_workspace_cuda(p, t.dtype);
    return t.int32_index ? msda_int32_levels_workspace_cuda(p) : 0;
  }
  // Only int32 tables need workspace: their int64 copies, 3 L values; L from either table's maxima.
  static size_t workspace_bound(const OpCall& c, const OpTypes& t) {
    if (!t.int32_index) return 0;
    const auto dim0 = [&](int i) {
      const Shape* s = c.shapes.in[i];
      return s != nullptr && !s->empty() && (*s)[0] > 0 ? (*s)[0] : int64_t(0);
    };
    Params p;
    p.num_levels = std::max(dim0(kShapes), dim0(kStarts));
    return msda_int32_levels_workspace_cuda(p);
  }

  static Status forward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return msda_forward_cpu<T>(p, in_ptr<T>(b, kValue), table(b, kShapes), table(b, kStarts),
                                 in_ptr<T>(b, kLocations), in_ptr<T>(b, kWeights), out_ptr<T>(b, 0), *dev.cpu);
    });
  }
  static Status backward_cpu(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (empty(p)) return Status::Ok();
    return dispatch_cpu(t.dtype, [&](auto z) {
      using T = decltype(z);
      return msda_backward_cpu<T>(p, static_cast<const T*>(b.grad_out[0]), in_ptr<T>(b, kValue), table(b, kShapes),
                                  table(b, kStarts), in_ptr<T>(b, kLocations), in_ptr<T>(b, kWeights),
                                  grad_ptr<T>(b, kValue), grad_ptr<T>(b, kLocations), grad_ptr<T>(b, kWeights),
                                  *dev.cpu);
    });
  }
  // The level tables stay on the device: a bad table gives zeros (msda_levels_valid; no sync to report it), and a
  // device-side assert where the front end asks (the torch op).
  static Status forward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    const int64_t* shapes = table(b, kShapes);
    const int64_t* starts = table(b, kStarts);
    if (t.int32_index) {
      DCNKIT_RETURN_IF_ERROR(msda_levels_to_int64_cuda(p, static_cast<const int32_t*>(b.in[kShapes]),
                                                       static_cast<const int32_t*>(b.in[kStarts]), b.workspace,
                                                       *dev.cuda, &shapes, &starts));
    }
    if (dev.device_asserts) DCNKIT_RETURN_IF_ERROR(msda_assert_levels_cuda(p, shapes, starts, *dev.cuda));
    return msda_forward_cuda(p, t.dtype, b.in[kValue], shapes, starts, b.in[kLocations], b.in[kWeights], b.out[0],
                             *dev.cuda);
  }
  static Status backward_cuda(const Params& p, const OpTypes& t, const OpBuffers& b, const OpDevice& dev) {
    if (empty(p)) return Status::Ok();
    if (dev.device_asserts) {
      DCNKIT_RETURN_IF_ERROR(msda_assert_levels_cuda(p, table(b, kShapes), table(b, kStarts), *dev.cuda));
    }
    return msda_backward_cuda(p, t.dtype, b.grad_out[0], b.in[kValue], table(b, kShapes), table(b, kStarts),
                              b.in[kLocations], b.in[kWeights], b.grad_in[kValue], b.grad_in[kLocations],
                              b.grad_in[kWeights], b.workspace, *dev.cuda);
  }
};

// mmdeploy's and mmcv's MMCVMultiScaleDeformableAttention: the canonical inputs, in the same order (their im2col_step
// attribute is ignored). TensorRT's own plugin name (no fields): the same five inputs (TensorRT's plugin takes the
// level tables in int32; the kit's takes int32 or int64), output (N, Lq, M, D). TensorRT has no domains: the variant
// of domain "" is its creator, and the ONNX Runtime library does not register it (the default ONNX domain). ONNX
// Runtime runs the name in the domains the exporters that write it use (torch symbolics: "nvidia::", "trt::",
// "TRT::"), with int64 tables as torch writes them (TensorRT's ONNX parser casts them to int32 for this plugin).
void variants(const OpDecl* op, std::vector<OpVariant>* out) {
  for (const char* domain : {"mmdeploy", "mmcv"}) {
    out->push_back({domain, "MMCVMultiScaleDeformableAttention", op, canonical_inputs(op->def), {}, false, false});
  }
  for (const char* domain : {"", "nvidia", "trt", "TRT"}) {
    OpVariant v{domain, "MultiscaleDeformableAttnPlugin_TRT", op, canonical_inputs(op->def), {}, false, false};
    v.tensorrt_only = domain[0] == '\0';
    v.per_head_output = true;
    out->push_back(v);
  }
}

}  // namespace

DCNKIT_OP(multi_scale_deformable_attn, 6, Op,
          DCNKIT_OP_DEF("multi_scale_deformable_attn", "MultiScaleDeformableAttention", kInputs, kOutputs, nullptr,
                        false),
          // value (N, S, M, D), spatial_shapes (L, 2) int64, level_start_index (L) int64, sampling_locations
          // (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P). Returns (N, Lq, M*D).
          "multi_scale_deformable_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
          "Tensor sampling_locations, Tensor attention_weights) -> Tensor",
          // Returns (grad_value, grad_sampling_locations, grad_attention_weights).
          "_multi_scale_deformable_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
          "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights) -> (Tensor, Tensor, Tensor)",
          &variants)

}  // namespace dcnkit
