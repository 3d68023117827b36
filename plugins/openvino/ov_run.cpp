#include "ov_run.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <memory>

#include "dcnkit/openblas_gemm.h"
#include "openvino/core/type/bfloat16.hpp"
#include "openvino/core/type/float16.hpp"
#include "ov_op.h"

namespace dcnkit::ov_ext {

// ---------------------------------------------------------------------------------------------
// CPU context

namespace {

constexpr int64_t kChunksPerThread = 4;

void tbb_parallel_for(void*, int64_t n, void (*body)(void*, int64_t, int64_t), void* body_ctx) {
  if (n <= 0) return;
  const int64_t threads = std::max(1, tbb::this_task_arena::max_concurrency());
  const int64_t chunks = std::min<int64_t>(n, threads * kChunksPerThread);
  if (chunks <= 1) {
    body(body_ctx, 0, n);
    return;
  }
  tbb::parallel_for(int64_t(0), chunks, [&](int64_t i) {
    const int64_t b = n * i / chunks, e = n * (i + 1) / chunks;
    if (e > b) body(body_ctx, b, e);
  });
}

}  // namespace

CpuContext cpu_context() {
  CpuContext ctx;
  ctx.num_threads = std::max(1, tbb::this_task_arena::max_concurrency());
  ctx.parallel_for = &tbb_parallel_for;
  ctx.gemm = &openblas_gemm;
  ctx.gemm_min_n = openblas_min_n();
  return ctx;
}

// ---------------------------------------------------------------------------------------------
// Inputs by canonical index

namespace {

struct Gathered {
  const Shape* shapes[kMaxInputs] = {};   // null: absent
  const void* data[kMaxInputs] = {};
  std::vector<Shape> features;            // MultiLevelRoIAlign's maps
  std::vector<const float*> feature_data;
};

Status gather(const KitOpBase& op, const std::vector<Shape>& shapes, const ov::TensorVector* tensors, Gathered* g) {
  const auto& slots = op.slots();
  if (slots.size() != shapes.size()) {
    return Status::Internal("expected " + std::to_string(slots.size()) + " inputs, got " +
                            std::to_string(shapes.size()));
  }
  const bool multi_level = op.kind() == OpKind::kMultiLevelRoIAlign;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t slot = slots[i];
    const void* data = tensors ? (*tensors)[i].data() : nullptr;
    if (multi_level && slot == kMlFeatures) {
      g->features.push_back(shapes[i]);
      g->feature_data.push_back(static_cast<const float*>(data));
    } else {
      g->shapes[slot] = &shapes[i];
      g->data[slot] = data;
    }
  }
  return Status::Ok();
}

template <typename T>
const T* in(const Gathered& g, int slot) {
  return static_cast<const T*>(g.data[slot]);
}

const char* op_type(const KitOpBase& op) { return op_def(op.kind()).onnx_type; }

// The op's params from the gathered shapes (the core checks them), and the output shape.
template <typename Params>
Status params_for(const KitOpBase& op, const Gathered& g, Params* p) {
  return make_params(op_type(op), op.attrs(), g.shapes, p);
}
template <>
Status params_for(const KitOpBase& op, const Gathered& g, MultiLevelRoIAlignParams* p) {
  if (g.shapes[kMlRois] == nullptr) return arg_error(op_type(op), "rois", "a tensor", "no input");
  return make_params(op_type(op), op.attrs(), *g.shapes[kMlRois], g.features, p);
}

// Calls f(params) with the params type of the op's kind.
template <typename F>
Status with_params(const KitOpBase& op, const Gathered& g, F&& f) {
  switch (op.kind()) {
#define DCNKIT_OV_PARAMS(K, P)                     \
  case K: {                                        \
    P p;                                           \
    DCNKIT_RETURN_IF_ERROR(params_for(op, g, &p)); \
    return f(p);                                   \
  }
    DCNKIT_OV_PARAMS(OpKind::kDeformConv2d, DeformConv2dParams)
    DCNKIT_OV_PARAMS(OpKind::kRoIAlign, RoIAlignParams)
    DCNKIT_OV_PARAMS(OpKind::kDeformRoIPool, DeformRoIPoolParams)
    DCNKIT_OV_PARAMS(OpKind::kDeformPSRoIPool, DeformPSRoIPoolParams)
    DCNKIT_OV_PARAMS(OpKind::kMultiLevelRoIAlign, MultiLevelRoIAlignParams)
    DCNKIT_OV_PARAMS(OpKind::kMultiScaleDeformableAttention, MsdaParams)
    DCNKIT_OV_PARAMS(OpKind::kDCNv3, Dcnv3Params)
    DCNKIT_OV_PARAMS(OpKind::kDCNv4, Dcnv3Params)
#undef DCNKIT_OV_PARAMS
  }
  return Status::Internal("unknown op kind");
}

// ---------------------------------------------------------------------------------------------
// The launchers, one per params type

struct Launch {
  const KitOpBase& op;
  const Gathered& g;
  float* y;
  float* count;  // DeformPSRoIPool's second output (null: not an output of the node)
  CpuContext cpu;

  Status operator()(const DeformConv2dParams& p) const {
    // The workspace stays with the thread that runs the node (grown when needed): a fresh allocation per run
    // costs its page faults every time. It is taken out of the thread's cache while in use, so that a node this
    // thread runs while it waits inside the launcher's parallel loop (TBB may hand it one) makes its own.
    thread_local std::vector<char> cache;
    std::vector<char> ws;
    ws.swap(cache);
    const size_t bytes = deform_conv2d_forward_workspace_cpu(p, DType::kFloat32, cpu);
    if (ws.size() < bytes) ws.resize(bytes);
    const auto packed = op.weight_kc(in<float>(g, kDcWeight), *g.shapes[kDcWeight]);
    const Status s = deform_conv2d_forward_cpu<float>(p, in<float>(g, kDcInput), in<float>(g, kDcOffset),
                                                      in<float>(g, kDcWeight), in<float>(g, kDcBias),
                                                      in<float>(g, kDcMask), y, ws.data(), cpu,
                                                      packed ? packed->data() : nullptr);
    cache.swap(ws);
    return s;
  }
  Status operator()(const RoIAlignParams& p) const {
    return roi_align_forward_cpu<float>(p, in<float>(g, kRaInput), in<float>(g, kRaRois), y, cpu);
  }
  Status operator()(const DeformRoIPoolParams& p) const {
    return deform_roi_pool_forward_cpu<float>(p, in<float>(g, kDrInput), in<float>(g, kDrRois), in<float>(g, kDrOffset),
                                              y, cpu);
  }
  Status operator()(const DeformPSRoIPoolParams& p) const {
    std::vector<float> own;  // the launcher always writes the count
    float* c = count;
    if (c == nullptr) {
      int64_t n = 1;
      for (int64_t d : p.output_shape()) n *= d;
      own.resize(static_cast<size_t>(n));
      c = own.data();
    }
    return deform_psroi_pool_forward_cpu<float>(p, in<float>(g, kPsInput), in<float>(g, kPsRois),
                                                in<float>(g, kPsTrans), y, c, cpu);
  }
  Status operator()(const MultiLevelRoIAlignParams& p) const {
    return multi_level_roi_align_forward_cpu<float>(p, g.feature_data.data(), in<float>(g, kMlRois), y, cpu);
  }
  Status operator()(const MsdaParams& p) const {
    return msda_forward_cpu<float>(p, in<float>(g, kMsdaValue), in<int64_t>(g, kMsdaSpatialShapes),
                                   in<int64_t>(g, kMsdaLevelStart), in<float>(g, kMsdaLocations),
                                   in<float>(g, kMsdaWeights), y, cpu);
  }
  Status operator()(const Dcnv3Params& p) const {  // DCNv4 reads its weights from offset_mask (p.fused)
    const float* offset = in<float>(g, kD3Offset);
    const float* mask = p.fused ? offset : in<float>(g, kD3Mask);
    return dcnv3_forward_cpu<float>(p, in<float>(g, kD3Input), offset, mask, y, cpu);
  }
};

std::vector<Shape> shapes_of(const ov::TensorVector& tensors) {
  std::vector<Shape> out;
  for (const ov::Tensor& t : tensors) {
    const ov::Shape s = t.get_shape();
    out.emplace_back(s.begin(), s.end());
  }
  return out;
}

}  // namespace

Status output_shape(const KitOpBase& op, const std::vector<Shape>& inputs, Shape* out) {
  Gathered g;
  DCNKIT_RETURN_IF_ERROR(gather(op, inputs, nullptr, &g));
  return with_params(op, g, [&](const auto& p) {
    *out = p.output_shape();
    return Status::Ok();
  });
}

bool is_kernel_float_type(const ov::element::Type& t) {
  return t == ov::element::f32 || t == ov::element::f16 || t == ov::element::bf16;
}

namespace {

Status run_f32(const KitOpBase& op, ov::TensorVector& outputs, const ov::TensorVector& inputs) {
  const std::vector<Shape> shapes = shapes_of(inputs);
  Gathered g;
  DCNKIT_RETURN_IF_ERROR(gather(op, shapes, &inputs, &g));
  return with_params(op, g, [&](const auto& p) {
    const Shape y = p.output_shape();
    for (ov::Tensor& t : outputs) t.set_shape(ov::Shape(y.begin(), y.end()));
    if (outputs.empty()) return Status::Internal("no output tensor");
    Launch launch{op, g, outputs[0].data<float>(), outputs.size() > 1 ? outputs[1].data<float>() : nullptr,
                  cpu_context()};
    return launch(p);
  });
}

// A float16 / bfloat16 tensor as float32, and back.
template <typename T>
void convert(const ov::Tensor& from, ov::Tensor& to) {
  const T* s = from.data<const T>();
  float* d = to.data<float>();
  for (size_t i = 0, n = from.get_size(); i < n; ++i) d[i] = static_cast<float>(s[i]);
}
template <typename T>
void convert_back(const ov::Tensor& from, ov::Tensor& to) {
  const float* s = from.data<const float>();
  T* d = to.data<T>();
  for (size_t i = 0, n = from.get_size(); i < n; ++i) d[i] = T(s[i]);
}

}  // namespace

Status run_cpu(const KitOpBase& op, ov::TensorVector& outputs, const ov::TensorVector& inputs) {
  const OpDef& def = op_def(op.kind());
  ov::element::Type float_type = ov::element::f32;
  for (size_t i = 0; i < inputs.size() && i < op.slots().size(); ++i) {
    const TensorDef& td = def.inputs[op.slots()[i]];
    const ov::element::Type got = inputs[i].get_element_type();
    const bool ok = td.int64 ? (got == ov::element::i64 || got == ov::element::i32) : is_kernel_float_type(got);
    if (!ok) {
      const char* want = td.int64 ? "element type i64 (or i32)" : "element type f32 (or f16 / bf16)";
      return arg_error(op_type(op), td.name, want, got.get_type_name());
    }
    if (!td.int64) float_type = got;
  }
  // Index tables the CPU plugin handed over as int32: widened to the kernels' int64.
  ov::TensorVector widened;
  bool any_i32 = false;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].get_element_type() != ov::element::i32) {
      widened.push_back(inputs[i]);
      continue;
    }
    any_i32 = true;
    ov::Tensor t(ov::element::i64, inputs[i].get_shape());
    const int32_t* src = inputs[i].data<const int32_t>();
    int64_t* dst = t.data<int64_t>();
    for (size_t k = 0, n = t.get_size(); k < n; ++k) dst[k] = src[k];
    widened.push_back(t);
  }
  if (any_i32) return run_cpu(op, outputs, widened);
  if (float_type == ov::element::f32) return run_f32(op, outputs, inputs);
  // Reduced precision around the node: the kernels compute in float32.
  const bool half = float_type == ov::element::f16;
  ov::TensorVector in32;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].get_element_type() != float_type) {
      in32.push_back(inputs[i]);
      continue;
    }
    ov::Tensor t(ov::element::f32, inputs[i].get_shape());
    half ? convert<ov::float16>(inputs[i], t) : convert<ov::bfloat16>(inputs[i], t);
    in32.push_back(t);
  }
  ov::TensorVector out32;
  for (size_t i = 0; i < outputs.size(); ++i) out32.emplace_back(ov::element::f32, ov::Shape{0});
  DCNKIT_RETURN_IF_ERROR(run_f32(op, out32, in32));
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].set_shape(out32[i].get_shape());
    half ? convert_back<ov::float16>(out32[i], outputs[i]) : convert_back<ov::bfloat16>(out32[i], outputs[i]);
  }
  return Status::Ok();
}

}  // namespace dcnkit::ov_ext
