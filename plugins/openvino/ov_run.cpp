#include "ov_run.h"

#include <tbb/parallel_for.h>
#include <tbb/task_arena.h>

#include <algorithm>
#include <limits>
#include <memory>

#include "dcnkit/cpu_gemm.h"
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
  ctx.gemm = &cpu_gemm;
  ctx.gemm_min_n = cpu_gemm_min_n(false);  // run_f32 narrows it for a node with a packed weight
  return ctx;
}

// ---------------------------------------------------------------------------------------------
// Inputs by canonical index

namespace {

int64_t numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

// A call of `op`: the shapes (and data) of its inputs by canonical index, a variadic input's tensors in order.
struct Gathered {
  std::vector<Shape> storage;
  OpShapes shapes;
  OpBuffers buffers;
};

Status gather(const KitOpBase& op, const std::vector<Shape>& shapes, const ov::TensorVector* tensors, Gathered* g) {
  const auto& slots = op.slots();
  if (slots.size() != shapes.size()) {
    return Status::Internal("expected " + std::to_string(slots.size()) + " inputs, got " +
                            std::to_string(shapes.size()));
  }
  const OpDef& def = op.op().def;
  g->storage = shapes;
  for (size_t i = 0; i < slots.size(); ++i) {
    const int64_t slot = slots[i];
    if (op.empty_input_is_absent(slot) && numel(shapes[i]) == 0) continue;  // no input (mmcv's convention)
    const void* data = tensors ? (*tensors)[i].data() : nullptr;
    if (def.inputs[slot].variadic) {
      g->shapes.variadic.push_back(shapes[i]);
      g->buffers.variadic.push_back(data);
      if (g->shapes.in[slot] != nullptr) continue;  // the canonical entry is the first tensor
    }
    g->shapes.in[slot] = &g->storage[i];
    g->buffers.in[slot] = data;
  }
  return Status::Ok();
}

std::vector<Shape> shapes_of(const ov::TensorVector& tensors) {
  std::vector<Shape> out;
  for (const ov::Tensor& t : tensors) {
    const ov::Shape s = t.get_shape();
    out.emplace_back(s.begin(), s.end());
  }
  return out;
}


}  // namespace

Status output_shapes(const KitOpBase& op, const std::vector<Shape>& inputs, std::vector<Shape>* out) {
  Gathered g;
  DCNKIT_RETURN_IF_ERROR(gather(op, inputs, nullptr, &g));
  Shape y[kMaxOutputs];
  DCNKIT_RETURN_IF_ERROR(op.op().entry.outputs(op_call(op.attrs(), g.shapes), y));
  out->assign(y, y + op.op().def.num_outputs);
  return Status::Ok();
}

bool is_kernel_float_type(const ov::element::Type& t) {
  return t == ov::element::f32 || t == ov::element::f16 || t == ov::element::bf16 || t == ov::element::f64;
}

namespace {

Status run_f32(const KitOpBase& op, ov::TensorVector& outputs, const ov::TensorVector& inputs) {
  const std::vector<Shape> shapes = shapes_of(inputs);
  Gathered g;
  DCNKIT_RETURN_IF_ERROR(gather(op, shapes, &inputs, &g));
  const OpCall call = op_call(op.attrs(), g.shapes);
  const OpEntry& e = op.op().entry;
  Shape y[kMaxOutputs];
  DCNKIT_RETURN_IF_ERROR(e.outputs(call, y));
  if (outputs.empty()) return Status::Internal("no output tensor");
  // Every output the op has: the node's own, scratch for one it does not have (the launchers write them all).
  std::vector<std::vector<float>> scratch;
  bool empty = true;
  for (size_t o = 0; o < op.op().def.num_outputs; ++o) {
    empty = empty && numel(y[o]) == 0;
    if (o < outputs.size()) {
      outputs[o].set_shape(ov::Shape(y[o].begin(), y[o].end()));
      g.buffers.out[o] = outputs[o].data<float>();
    } else {
      scratch.emplace_back(static_cast<size_t>(numel(y[o])));
      g.buffers.out[o] = scratch.back().data();
    }
  }
  if (empty) return Status::Ok();
  bool bf16 = false;
  DCNKIT_RETURN_IF_ERROR(op.gemm_bf16(&bf16));  // a bad rt_info value is an error, not float32 in silence
  std::shared_ptr<const std::vector<char>> packed[kMaxInputs];
  std::shared_ptr<const void> gemm_packed[kMaxInputs];
  CpuContext cpu = cpu_context();
  for (size_t i = 0; i < kMaxInputs; ++i) {
    if (g.shapes.in[i] == nullptr) continue;
    packed[i] = op.packed(static_cast<int>(i), g.buffers.in[i], *g.shapes.in[i], &gemm_packed[i]);
    if (packed[i]) g.buffers.packed[i] = packed[i]->data();
    g.buffers.gemm_packed[i] = gemm_packed[i].get();
    if (gemm_packed[i]) cpu.gemm_min_n = cpu_gemm_min_n(true);
  }
  OpDevice dev;
  dev.cpu = &cpu;
  OpTypes types;  // float32 (run_cpu converts 16-bit tensors around the kernels)
  // The workspace stays with the thread that runs the node (grown when needed): a fresh allocation per run costs its
  // page faults every time. It is taken out of the thread's cache while in use, so that a node this thread runs while
  // it waits inside the launcher's parallel loop (TBB may hand it one) makes its own.
  thread_local std::vector<char> cache;
  std::vector<char> ws;
  ws.swap(cache);
  const size_t bytes = e.workspace ? e.workspace(call, Pass::kForward, types, dev) : 0;
  if (ws.size() < bytes) ws.resize(bytes);
  g.buffers.workspace = bytes ? ws.data() : nullptr;
  const Status s = e.forward_cpu(call, types, g.buffers, dev);
  cache.swap(ws);
  return s;
}

// A float16 / bfloat16 / float64 tensor as float32, and back.
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
void to_f32(const ov::Tensor& from, ov::Tensor& to) {
  const ov::element::Type t = from.get_element_type();
  if (t == ov::element::f16) return convert<ov::float16>(from, to);
  if (t == ov::element::bf16) return convert<ov::bfloat16>(from, to);
  convert<double>(from, to);
}
void from_f32(const ov::Tensor& from, ov::Tensor& to) {
  const ov::element::Type t = to.get_element_type();
  if (t == ov::element::f16) return convert_back<ov::float16>(from, to);
  if (t == ov::element::bf16) return convert_back<ov::bfloat16>(from, to);
  convert_back<double>(from, to);
}

// A quiet NaN in every element of a floating tensor.
template <typename T>
void fill_nan(ov::Tensor& t) {
  T* d = t.data<T>();
  for (size_t i = 0, n = t.get_size(); i < n; ++i) d[i] = T(std::numeric_limits<float>::quiet_NaN());
}

}  // namespace

Status run_cpu(const KitOpBase& op, ov::TensorVector& outputs, const ov::TensorVector& inputs) {
  const OpDef& def = op.op().def;
  ov::element::Type float_type = ov::element::f32;
  for (size_t i = 0; i < inputs.size() && i < op.slots().size(); ++i) {
    const TensorDef& td = def.inputs[op.slots()[i]];
    const ov::element::Type got = inputs[i].get_element_type();
    const bool ok = td.int64 ? (got == ov::element::i64 || got == ov::element::i32) : is_kernel_float_type(got);
    if (!ok) {
      const char* want = td.int64 ? "element type i64 (or i32)" : "element type f32 (or f16 / bf16 / f64)";
      return arg_error(def.onnx_type, td.name, want, got.get_type_name());
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
  // Another precision around the node: the kernels compute in float32.
  ov::TensorVector in32;
  for (size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].get_element_type() != float_type) {
      in32.push_back(inputs[i]);
      continue;
    }
    ov::Tensor t(ov::element::f32, inputs[i].get_shape());
    to_f32(inputs[i], t);
    in32.push_back(t);
  }
  ov::TensorVector out32;
  for (size_t i = 0; i < outputs.size(); ++i) out32.emplace_back(ov::element::f32, ov::Shape{0});
  DCNKIT_RETURN_IF_ERROR(run_f32(op, out32, in32));
  for (size_t i = 0; i < outputs.size(); ++i) {
    outputs[i].set_shape(out32[i].get_shape());
    from_f32(out32[i], outputs[i]);
  }
  return Status::Ok();
}

void poison_outputs(ov::TensorVector& outputs) {
  for (ov::Tensor& t : outputs) {
    if (!t || t.get_size() == 0 || t.data() == nullptr) continue;
    const ov::element::Type e = t.get_element_type();
    if (e == ov::element::f32) fill_nan<float>(t);
    if (e == ov::element::f16) fill_nan<ov::float16>(t);
    if (e == ov::element::bf16) fill_nan<ov::bfloat16>(t);
    if (e == ov::element::f64) fill_nan<double>(t);
  }
}

}  // namespace dcnkit::ov_ext
