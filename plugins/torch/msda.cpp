// PyTorch kernels of multi_scale_deformable_attn and its backward op: one function per op for CPU and
// CUDA, dispatching on the device (run_on_device). Schemas: schema.cpp; fake kernels and autograd:
// python/dcnkit/ops/msda.py. The level tables (int64) stay where they are: the CPU launchers check their
// values on the host, the CUDA kernels read them on the device (never copied to the host): a bad table gives
// zeros there, and the op raises an asynchronous device-side assert (assert_levels_async).
#include <c10/core/DeviceGuard.h>

#include <string>
#include <tuple>

#include "dcnkit/msda.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {
namespace {

constexpr const char* kForward = "multi_scale_deformable_attn";
constexpr const char* kBackward = "_multi_scale_deformable_attn_backward";

// CUDA: msda_levels_valid's rules (msda_kernels.h) in tensor ops on the device, reported as torch reports a bad
// index: an asynchronous device-side assert (no host sync, capturable in a CUDA graph; the error surfaces at the
// next synchronisation). The kernels give zeros for such a table.
void assert_levels_async(const char* op, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                         int64_t S) {
  const at::Tensor H = spatial_shapes.select(1, 0), W = spatial_shapes.select(1, 1), start = level_start_index;
  // start + H*W <= S written without overflow: H <= (S - start) / W for W > 0.
  const at::Tensor fits = (W == 0) | (H <= at::floor_divide(-start + S, W.clamp_min(1)));
  const at::Tensor each = (H >= 0) & (W >= 0) & (start >= 0) & (start <= S) & fits;
  const at::Tensor total = at::where(each, H * W, at::zeros_like(H)).sum();
  at::_assert_async(at::logical_and(each.all(), total == S),
                    std::string(op) + ": spatial_shapes / level_start_index: expected every H, W >= 0, 0 <= start, "
                    "start + H*W <= S and sum of H*W equal to S = " + std::to_string(S) +
                    " (value's dim 1), got a table that breaks one of these");
}

// Shapes (core checks), then devices and dtypes: the level tables int64 on value's device, the float
// tensors of value's dtype.
MsdaParams params_of(const char* op, const at::Tensor& value, const at::Tensor& spatial_shapes,
                     const at::Tensor& level_start_index, const at::Tensor& sampling_locations,
                     const at::Tensor& attention_weights) {
  MsdaParams p;
  throw_if_error(make_msda_params(op, shape_of(value), shape_of(spatial_shapes), shape_of(level_start_index),
                                  shape_of(sampling_locations), shape_of(attention_weights), &p));
  check_dtype_supported(op, value, false);
  for (const auto& [arg, t] : {std::pair<const char*, const at::Tensor*>{"spatial_shapes", &spatial_shapes},
                               {"level_start_index", &level_start_index}}) {
    TORCH_CHECK_VALUE(t->device() == value.device(), op, ": ", arg, ": expected a tensor on ", value.device(),
                      " (the device of value), got ", t->device());
    TORCH_CHECK_TYPE(t->scalar_type() == at::kLong, op, ": ", arg, ": expected dtype int64, got ",
                     t->scalar_type());
  }
  return p;
}

void check_floats(const char* op, const at::Tensor& value,
                  std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  for (const auto& o : others) {
    TORCH_CHECK_VALUE(o.second->device() == value.device(), op, ": ", o.first, ": expected a tensor on ",
                      value.device(), " (the device of value), got ", o.second->device());
    TORCH_CHECK_TYPE(o.second->scalar_type() == value.scalar_type(), op, ": ", o.first, ": expected dtype ",
                     value.scalar_type(), " (the dtype of value), got ", o.second->scalar_type());
  }
}

// The five inputs made contiguous, and the level tables' pointers for the launchers.
struct ContiguousInputs {
  at::Tensor value, spatial_shapes, level_start_index, locations, weights;
  ContiguousInputs(const at::Tensor& v, const at::Tensor& ss, const at::Tensor& lsi, const at::Tensor& loc,
                   const at::Tensor& w)
      : value(v.contiguous()), spatial_shapes(ss.contiguous()), level_start_index(lsi.contiguous()),
        locations(loc.contiguous()), weights(w.contiguous()) {}
  const int64_t* ss() const { return spatial_shapes.const_data_ptr<int64_t>(); }
  const int64_t* lsi() const { return level_start_index.const_data_ptr<int64_t>(); }
};

at::Tensor multi_scale_deformable_attn(const at::Tensor& value_, const at::Tensor& spatial_shapes_,
                                       const at::Tensor& level_start_index_, const at::Tensor& sampling_locations_,
                                       const at::Tensor& attention_weights_) {
  const char* op = kForward;
  const MsdaParams p =
      params_of(op, value_, spatial_shapes_, level_start_index_, sampling_locations_, attention_weights_);
  check_floats(op, value_, {{"sampling_locations", &sampling_locations_}, {"attention_weights", &attention_weights_}});
  if (computes_in_float32(value_)) {
    return multi_scale_deformable_attn(value_.to(at::kFloat), spatial_shapes_, level_start_index_,
                                       sampling_locations_.to(at::kFloat), attention_weights_.to(at::kFloat))
        .to(value_.scalar_type());
  }
  c10::DeviceGuard guard(value_.device());
  const ContiguousInputs in(value_, spatial_shapes_, level_start_index_, sampling_locations_, attention_weights_);
  const at::Tensor& value = in.value;
  at::Tensor output = at::empty(p.output_shape(), value.options());
  if (output.numel() == 0) return output;
  run_on_device(
      op, value,
      [&](auto zero) {
        using T = decltype(zero);
        return msda_forward_cpu<T>(p, value.const_data_ptr<T>(), in.ss(), in.lsi(), in.locations.const_data_ptr<T>(),
                                   in.weights.const_data_ptr<T>(), output.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_levels_async(op, in.spatial_shapes, in.level_start_index, p.num_values);
        return msda_forward_cuda(p, dtype_of(value), value.const_data_ptr(), in.ss(), in.lsi(),
                                 in.locations.const_data_ptr(), in.weights.const_data_ptr(), output.mutable_data_ptr(),
                                 cuda);
      });
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> multi_scale_deformable_attn_backward(
    const at::Tensor& grad_output_, const at::Tensor& value_, const at::Tensor& spatial_shapes_,
    const at::Tensor& level_start_index_, const at::Tensor& sampling_locations_, const at::Tensor& attention_weights_) {
  const char* op = kBackward;
  alert_atomic_cuda_backward(op, value_);
  const MsdaParams p =
      params_of(op, value_, spatial_shapes_, level_start_index_, sampling_locations_, attention_weights_);
  check_floats(op, value_,
               {{"sampling_locations", &sampling_locations_}, {"attention_weights", &attention_weights_},
                {"grad_output", &grad_output_}});
  TORCH_CHECK_VALUE(shape_of(grad_output_) == p.output_shape(), op, ": grad_output: expected shape ",
                    shape_str(p.output_shape()), ", got ", shape_str(shape_of(grad_output_)));
  if (computes_in_float32(value_)) {
    auto [gv, gl, gw] = multi_scale_deformable_attn_backward(
        grad_output_.to(at::kFloat), value_.to(at::kFloat), spatial_shapes_, level_start_index_,
        sampling_locations_.to(at::kFloat), attention_weights_.to(at::kFloat));
    const auto st = value_.scalar_type();
    return {gv.to(st), gl.to(st), gw.to(st)};
  }
  c10::DeviceGuard guard(value_.device());
  const ContiguousInputs in(value_, spatial_shapes_, level_start_index_, sampling_locations_, attention_weights_);
  const at::Tensor& value = in.value;
  const at::Tensor grad_output = grad_output_.contiguous();
  at::Tensor grad_value = at::empty(p.value_shape(), value.options());
  at::Tensor grad_locations = at::empty(p.locations_shape(), value.options());
  at::Tensor grad_weights = at::empty(p.weights_shape(), value.options());
  if (value.numel() == 0 || in.weights.numel() == 0) {
    grad_value.zero_();
    grad_locations.zero_();
    grad_weights.zero_();
    return {grad_value, grad_locations, grad_weights};
  }
  run_on_device(
      op, value,
      [&](auto zero) {
        using T = decltype(zero);
        return msda_backward_cpu<T>(p, grad_output.const_data_ptr<T>(), value.const_data_ptr<T>(), in.ss(), in.lsi(),
                                    in.locations.const_data_ptr<T>(), in.weights.const_data_ptr<T>(),
                                    grad_value.mutable_data_ptr<T>(), grad_locations.mutable_data_ptr<T>(),
                                    grad_weights.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_levels_async(op, in.spatial_shapes, in.level_start_index, p.num_values);
        at::Tensor ws = workspace_for(value, msda_backward_workspace_cuda(p, dtype_of(value)));
        return msda_backward_cuda(p, dtype_of(value), grad_output.const_data_ptr(), value.const_data_ptr(), in.ss(),
                                  in.lsi(), in.locations.const_data_ptr(), in.weights.const_data_ptr(),
                                  grad_value.mutable_data_ptr(), grad_locations.mutable_data_ptr(),
                                  grad_weights.mutable_data_ptr(), ws.mutable_data_ptr(), cuda);
      });
  return {grad_value, grad_locations, grad_weights};
}

void register_msda(torch::Library& m) {
  m.impl("multi_scale_deformable_attn", &multi_scale_deformable_attn);
  m.impl("_multi_scale_deformable_attn_backward", &multi_scale_deformable_attn_backward);
}

}  // namespace
}  // namespace dcnkit::torch_binding

DCNKIT_TORCH_IMPL_CPU_CUDA(dcnkit::torch_binding::register_msda)
