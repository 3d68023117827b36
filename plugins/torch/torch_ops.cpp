// The PyTorch kernels of every op of the table, forward and backward, CPU and CUDA: one boxed kernel that reads the
// op's declaration (dcnkit/op_decl.h). Schemas: schema.cpp; autocast: autocast.cpp; fake kernels and autograd: each
// op's Python module (python/dcnkit/ops/). No op is named here.
//
// A call: the schema's tensor arguments go to the op's canonical inputs by name (a backward's grad_<output> to the
// output gradients, an output's name to the saved output), its scalars fill the table's attributes in order (an
// `ints` attribute as that many ints, a bool as 0 / 1); an attribute left without a scalar says whether every
// optional input is absent (DeformPSRoIPool's no_trans). Every tensor is checked for its device and dtype (those of
// the features), CPU float16 / bfloat16 compute in float32, the declaration checks the shapes, gives the output
// shapes and the workspace, and its launcher runs on the tensors' device. Gradient buffers are zeroed before the
// backward launchers; the gradient of an absent optional input is an empty tensor (numel 0).
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/DeviceGuard.h>

#include <map>
#include <string>
#include <vector>

#include "dcnkit/op_attrs.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {
namespace {

struct Registered {
  const OpDecl* decl;
  bool backward;
  std::string name;  // the torch op's name (no namespace), for messages
};

const std::map<std::string, Registered>& registered() {
  static const std::map<std::string, Registered> m = [] {
    std::map<std::string, Registered> r;
    for (const OpDecl* d : op_table()) {
      r["dcnkit::" + std::string(d->def.name)] = {d, false, d->def.name};
      if (d->torch_backward_schema != nullptr) {
        const std::string s = d->torch_backward_schema;
        const std::string name = s.substr(0, s.find('('));
        r["dcnkit::" + name] = {d, true, name};
      }
    }
    return r;
  }();
  return m;
}

int find_tensor(const TensorDef* defs, size_t n, const std::string& name) {
  for (size_t i = 0; i < n; ++i)
    if (name == defs[i].name) return static_cast<int>(i);
  return -1;
}

bool is_floating(const at::Tensor& t) { return t.is_floating_point(); }

// One call's arguments, by role.
struct Args {
  at::Tensor in[kMaxInputs];
  std::vector<at::Tensor> variadic;
  bool has_variadic = false;
  at::Tensor saved[kMaxOutputs];     // backward: outputs without a gradient (DeformPSRoIPool's count)
  at::Tensor grad_out[kMaxOutputs];  // backward: gradients of the outputs
  std::vector<AttrValue> attrs;
};

const char* kind_name(AttrKind k) {
  switch (k) {
    case AttrKind::kInt: return "an int";
    case AttrKind::kInts: return "ints";
    case AttrKind::kFloat: return "a float";
    case AttrKind::kString: return "a string";
    case AttrKind::kFloats: return "floats";
  }
  return "?";
}

// The stack's arguments as the op's inputs, gradients and attribute values.
Args read_args(const Registered& r, const c10::FunctionSchema& schema, torch::jit::Stack* stack) {
  const OpDef& def = r.decl->def;
  const auto& formals = schema.arguments();
  const size_t n = formals.size();
  auto values = torch::jit::last(*stack, n);
  Args a;
  std::vector<c10::IValue> scalars;
  for (size_t i = 0; i < n; ++i) {
    const std::string& name = formals[i].name();
    const c10::IValue& v = values[i];
    const bool tensor_like = v.isTensor() || v.isTensorList() ||
                             (v.isNone() && formals[i].type()->kind() == c10::TypeKind::OptionalType);
    if (!tensor_like) {
      scalars.push_back(v);
      continue;
    }
    const int c = find_tensor(def.inputs, def.num_inputs, name);
    if (c >= 0) {
      if (v.isTensorList()) {
        a.has_variadic = true;
        for (const at::Tensor& t : v.toTensorList()) a.variadic.push_back(t);
        if (!a.variadic.empty()) a.in[c] = a.variadic[0];
      } else if (v.isTensor()) {
        a.in[c] = v.toTensor();
      }
      continue;
    }
    const int o = find_tensor(def.outputs, def.num_outputs, name);
    if (o >= 0 && v.isTensor()) {
      a.saved[o] = v.toTensor();
      continue;
    }
    if (name.rfind("grad_", 0) == 0 && v.isTensor()) {
      const int g = find_tensor(def.outputs, def.num_outputs, name.substr(5));
      TORCH_CHECK(g >= 0, r.name, ": argument ", name, ": no output ", name.substr(5), " in the op table");
      a.grad_out[g] = v.toTensor();
      continue;
    }
    TORCH_CHECK(false, r.name, ": argument ", name, ": not an input or output of the op table");
  }
  bool all_optional_absent = true;
  for (size_t i = 0; i < def.num_inputs; ++i) {
    if (def.inputs[i].optional && a.in[i].defined()) all_optional_absent = false;
  }
  size_t next = 0;
  for (size_t k = 0; k < def.num_attrs; ++k) {
    const AttrDef& d = def.attrs[k];
    AttrValue val = parse_default(d);
    if (next >= scalars.size()) {  // no argument: whether the optional inputs are absent
      TORCH_CHECK(d.kind == AttrKind::kInt, r.name, ": attribute ", d.name, ": no argument in the schema");
      val.ints = {all_optional_absent ? 1 : 0};
      a.attrs.push_back(val);
      continue;
    }
    switch (d.kind) {
      case AttrKind::kInt: {
        const c10::IValue& s = scalars[next++];
        val.ints = {s.isBool() ? int64_t(s.toBool()) : s.toInt()};
        break;
      }
      case AttrKind::kInts: {
        val.ints.clear();
        const size_t count = parse_default(d).ints.size();
        for (size_t e = 0; e < count && next < scalars.size(); ++e) val.ints.push_back(scalars[next++].toInt());
        break;
      }
      case AttrKind::kFloat: val.f = scalars[next++].toDouble(); break;
      case AttrKind::kString: val.s = scalars[next++].toStringRef(); break;
      case AttrKind::kFloats: {
        const c10::IValue& s = scalars[next++];
        TORCH_CHECK(s.isDoubleList(), r.name, ": ", d.name, ": expected ", kind_name(d.kind));
        val.floats.clear();
        for (double x : s.toDoubleVector()) val.floats.push_back(x);
        break;
      }
    }
    a.attrs.push_back(std::move(val));
  }
  TORCH_CHECK(next == scalars.size(), r.name, ": expected ", next, " scalar arguments, got ", scalars.size());
  return a;
}

// The features: the first canonical input that is neither RoIs nor an index table (a variadic one's first tensor).
struct Features {
  at::Tensor t;
  std::string name;
};
Features features_of(const OpDef& def, const Args& a) {
  const int f = features_input(def);
  TORCH_CHECK(f >= 0 && a.in[f].defined(), def.name, ": no feature tensor");
  return {a.in[f], def.inputs[f].variadic ? std::string(def.inputs[f].name) + "[0]" : std::string(def.inputs[f].name)};
}

void check_like(const std::string& op, const std::string& arg, const at::Tensor& t, const Features& x, bool index) {
  TORCH_CHECK_VALUE(t.device() == x.t.device(), op, ": ", arg, ": expected a tensor on ", x.t.device(),
                    " (the device of ", x.name, "), got ", t.device());
  if (index) {
    TORCH_CHECK_TYPE(t.scalar_type() == at::kLong, op, ": ", arg, ": expected dtype int64, got ", t.scalar_type());
  } else {
    TORCH_CHECK_TYPE(t.scalar_type() == x.t.scalar_type(), op, ": ", arg, ": expected dtype ", x.t.scalar_type(),
                     " (the dtype of ", x.name, "), got ", t.scalar_type());
  }
}

// Device and dtype of every tensor: the features of a supported floating type on the CPU or CUDA, every other
// floating tensor like them, index tables int64 on their device.
void check_tensors(const std::string& op, const OpDef& def, const Args& a, const Features& x) {
  TORCH_CHECK_VALUE(x.t.device().is_cpu() || x.t.device().is_cuda(), op, ": ", x.name,
                    ": expected a CPU or CUDA tensor, got ", x.t.device());
  check_dtype_supported(op.c_str(), x.t, false);
  for (size_t i = 0; i < def.num_inputs; ++i) {
    if (def.inputs[i].variadic) {
      for (size_t l = 1; l < a.variadic.size(); ++l) {
        check_like(op, std::string(def.inputs[i].name) + "[" + std::to_string(l) + "]", a.variadic[l], x, false);
      }
      continue;
    }
    if (a.in[i].defined() && !a.in[i].is_same(x.t)) check_like(op, def.inputs[i].name, a.in[i], x, def.inputs[i].int64);
  }
  for (size_t o = 0; o < def.num_outputs; ++o) {
    if (a.saved[o].defined()) check_like(op, def.outputs[o].name, a.saved[o], x, false);
    if (a.grad_out[o].defined()) check_like(op, std::string("grad_") + def.outputs[o].name, a.grad_out[o], x, false);
  }
}

// CPU float16 / bfloat16: every floating tensor to float32 (the results go back to the features' dtype).
void to_float32(Args* a) {
  auto f32 = [](at::Tensor& t) {
    if (t.defined() && is_floating(t)) t = t.to(at::kFloat);
  };
  for (auto& t : a->in) f32(t);
  for (auto& t : a->variadic) f32(t);
  for (auto& t : a->saved) f32(t);
  for (auto& t : a->grad_out) f32(t);
}

void make_contiguous(const OpDef& def, Args* a) {
  for (auto& t : a->in)
    if (t.defined()) t = t.contiguous();
  for (auto& t : a->variadic) t = t.contiguous();
  for (size_t i = 0; i < def.num_inputs; ++i) {
    if (def.inputs[i].variadic && !a->variadic.empty()) a->in[i] = a->variadic[0];
  }
  for (auto& t : a->saved)
    if (t.defined()) t = t.contiguous();
  for (auto& t : a->grad_out)
    if (t.defined()) t = t.contiguous();
}

DType dtype_of_tensor(const at::Tensor& t) { return dtype_of(t); }

struct Call {
  OpShapes shapes;
  std::vector<Shape> storage;  // the shapes the pointers of `shapes` point to
  OpCall call;
};

void make_call(const Registered& r, const Args& a, Call* c) {
  const OpDef& def = r.decl->def;
  c->storage.assign(kMaxInputs, Shape());
  for (size_t i = 0; i < def.num_inputs; ++i) {
    if (!a.in[i].defined()) continue;
    c->storage[i] = shape_of(a.in[i]);
    c->shapes.in[i] = &c->storage[i];
  }
  for (const at::Tensor& t : a.variadic) c->shapes.variadic.push_back(shape_of(t));
  c->call.op = r.name.c_str();
  c->call.decl = r.decl;
  c->call.attrs = a.attrs.data();
  c->call.shapes = c->shapes;
}

// Runs the forward or backward launcher of the call's device; `dev` filled for the device.
template <typename Launch>
void on_device(const Registered& r, const at::Tensor& x, const OpCall& call, const OpTypes& types, Pass pass,
               OpBuffers* b, Launch&& launch) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const OpEntry& e = r.decl->entry;
  if (x.is_cpu()) {
    TORCH_CHECK_TYPE(x.scalar_type() == at::kFloat || x.scalar_type() == at::kDouble, r.name,
                     ": input: expected float32 or float64 inside the CPU kernel, got ", x.scalar_type());
    CpuPacks packs;
    const bool packed = pass == Pass::kForward && pack_cpu_operands(e, call, types.dtype, b, &packs);
    const CpuContext cpu = fast_cpu_context(packed);
    OpDevice dev;
    dev.cpu = &cpu;
    const size_t bytes = e.workspace ? e.workspace(call, pass, types, dev) : 0;
    const at::Tensor ws = workspace_for(x, bytes);
    b->workspace = bytes ? ws.mutable_data_ptr() : nullptr;
    throw_if_error(launch(pass == Pass::kForward ? e.forward_cpu : e.backward_cpu, dev));
    return;
  }
#ifdef DCNKIT_WITH_CUDA
  const c10::cuda::CUDAGuard guard(x.device());
  const CudaContext cuda = cuda_context(x);
  OpDevice dev;
  dev.cuda = &cuda;
  dev.device_asserts = true;  // a bad RoI batch index or level table: an asynchronous device-side assert
  const size_t bytes = e.workspace ? e.workspace(call, pass, types, dev) : 0;
  const at::Tensor ws = workspace_for(x, bytes);
  b->workspace = bytes ? ws.mutable_data_ptr() : nullptr;
  const auto fn = pass == Pass::kForward ? e.forward_cuda : e.backward_cuda;
  TORCH_CHECK(fn != nullptr, r.name, ": no CUDA kernel in this build");
  throw_if_error(launch(fn, dev));
#else
  TORCH_CHECK(false, r.name, ": input: expected a CPU tensor (dcnkit was built without CUDA), got ", x.device());
#endif
}

// The arguments as the launchers take them (float32 for CPU 16-bit features, contiguous), the call and the output
// shapes; returns the features tensor.
at::Tensor prepare(const Registered& r, Args* a, const Features& x0, Call* c, Shape* shapes) {
  if (computes_in_float32(x0.t)) to_float32(a);
  make_contiguous(r.decl->def, a);
  make_call(r, *a, c);
  throw_if_error(r.decl->entry.outputs(c->call, shapes));
  return features_of(r.decl->def, *a).t;
}

// The input pointers of the call and its types.
OpTypes bind_inputs(const OpDef& def, const Args& a, const at::Tensor& x, OpBuffers* b) {
  for (size_t i = 0; i < def.num_inputs; ++i) b->in[i] = a.in[i].defined() ? a.in[i].const_data_ptr() : nullptr;
  for (const at::Tensor& t : a.variadic) b->variadic.push_back(t.const_data_ptr());
  OpTypes types;
  types.dtype = dtype_of_tensor(x);
  types.rois = types.dtype;
  return types;
}

void forward(const Registered& r, Args a, const Features& x0, torch::jit::Stack* stack) {
  const OpDef& def = r.decl->def;
  const at::ScalarType st = x0.t.scalar_type();
  Call c;
  Shape shapes[kMaxOutputs];
  const at::Tensor x = prepare(r, &a, x0, &c, shapes);
  c10::DeviceGuard guard(x.device());
  std::vector<at::Tensor> outputs;
  bool empty = true;
  OpBuffers b;
  for (size_t o = 0; o < def.num_outputs; ++o) {
    outputs.push_back(at::empty(shapes[o], x.options()));
    b.out[o] = outputs.back().mutable_data_ptr();
    empty = empty && outputs.back().numel() == 0;
  }
  if (!empty) {
    const OpTypes types = bind_inputs(def, a, x, &b);
    on_device(r, x, c.call, types, Pass::kForward, &b, [&](auto fn, const OpDevice& dev) {
      return fn(c.call, types, b, dev);
    });
  }
  for (at::Tensor& t : outputs) torch::jit::push(*stack, st == t.scalar_type() ? t : t.to(st));
}

void backward(const Registered& r, Args a, const Features& x0, torch::jit::Stack* stack) {
  const OpDef& def = r.decl->def;
  const at::ScalarType st = x0.t.scalar_type();
  Call c;
  Shape shapes[kMaxOutputs];
  const at::Tensor x = prepare(r, &a, x0, &c, shapes);
  c10::DeviceGuard guard(x.device());
  OpBuffers b;
  bool empty = true;
  for (size_t o = 0; o < def.num_outputs; ++o) {
    if (a.grad_out[o].defined()) {
      TORCH_CHECK_VALUE(shape_of(a.grad_out[o]) == shapes[o], r.name, ": grad_", def.outputs[o].name,
                        ": expected shape ", shape_str(shapes[o]), ", got ", shape_str(shape_of(a.grad_out[o])));
      b.grad_out[o] = a.grad_out[o].const_data_ptr();
      empty = empty && a.grad_out[o].numel() == 0;
    }
    if (a.saved[o].defined()) {
      TORCH_CHECK_VALUE(shape_of(a.saved[o]) == shapes[o], r.name, ": ", def.outputs[o].name, ": expected shape ",
                        shape_str(shapes[o]), ", got ", shape_str(shape_of(a.saved[o])));
      b.out[o] = const_cast<void*>(a.saved[o].const_data_ptr());
    }
  }
  // The gradients, zeroed: of every input with a gradient (an absent optional input's: empty).
  std::vector<c10::IValue> results;
  at::Tensor grads[kMaxInputs];
  std::vector<at::Tensor> grad_list;
  int64_t grad_elements = 0;
  for (size_t i = 0; i < def.num_inputs; ++i) {
    if (!def.inputs[i].grad) continue;
    if (def.inputs[i].variadic) {
      for (const at::Tensor& t : a.variadic) {
        grad_list.push_back(at::zeros_like(t, at::MemoryFormat::Contiguous));
        b.grad_variadic.push_back(grad_list.back().mutable_data_ptr());
        grad_elements += t.numel();
      }
      results.emplace_back(grad_list);
      continue;
    }
    grads[i] = a.in[i].defined() ? at::zeros_like(a.in[i], at::MemoryFormat::Contiguous) : x.new_zeros({0});
    if (a.in[i].defined()) {
      b.grad_in[i] = grads[i].mutable_data_ptr();
      grad_elements += grads[i].numel();
    }
    results.emplace_back(grads[i]);
  }
  if (x.is_cuda()) {
    const auto det = r.decl->entry.deterministic;
    if (det == nullptr || !det(c.call, dtype_of_tensor(x))) alert_atomic_cuda_backward(r.name.c_str(), x);
  }
  if (!empty && grad_elements > 0) {
    const OpTypes types = bind_inputs(def, a, x, &b);
    on_device(r, x, c.call, types, Pass::kBackward, &b, [&](auto fn, const OpDevice& dev) {
      TORCH_CHECK(fn != nullptr, r.name, ": the op has no backward");
      return fn(c.call, types, b, dev);
    });
  }
  for (c10::IValue& v : results) {
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      torch::jit::push(*stack, t.scalar_type() == st ? t : t.to(st));
    } else {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) list.push_back(t.scalar_type() == st ? t : t.to(st));
      torch::jit::push(*stack, c10::IValue(list));
    }
  }
}

// The kernel of every dcnkit op and backward op, for the CPU and CUDA dispatch keys.
void kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& reg = registered();
  const auto it = reg.find(op.schema().name());
  TORCH_CHECK(it != reg.end(), "dcnkit: no declaration for ", op.schema().name());
  const Registered& r = it->second;
  const c10::FunctionSchema& schema = op.schema();
  Args a = read_args(r, schema, stack);
  torch::jit::drop(*stack, schema.arguments().size());
  if (a.has_variadic && a.variadic.empty()) {  // no feature tensor: the declaration's shape checks say why
    Call c;
    make_call(r, a, &c);
    Shape shapes[kMaxOutputs];
    throw_if_error(r.decl->entry.outputs(c.call, shapes));
    TORCH_CHECK_VALUE(false, r.name, ": ", r.decl->def.inputs[features_input(r.decl->def)].name,
                      ": expected at least one tensor, got none");
  }
  const Features x = features_of(r.decl->def, a);
  check_tensors(r.name, r.decl->def, a, x);
  if (r.backward) {
    backward(r, std::move(a), x, stack);
  } else {
    forward(r, std::move(a), x, stack);
  }
}

void register_kernels(torch::Library& m) {
  for (const auto& [name, r] : registered()) {
    m.impl(name.c_str() + std::string("dcnkit::").size(), torch::CppFunction::makeFromBoxedFunction<&kernel>());
  }
}

}  // namespace
}  // namespace dcnkit::torch_binding

TORCH_LIBRARY_IMPL(dcnkit, CPU, m) { dcnkit::torch_binding::register_kernels(m); }
#ifdef DCNKIT_WITH_CUDA
TORCH_LIBRARY_IMPL(dcnkit, CUDA, m) { dcnkit::torch_binding::register_kernels(m); }
#endif
