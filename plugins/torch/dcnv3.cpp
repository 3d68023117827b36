// PyTorch kernels of dcnv3 / dcnv4 and their backward ops: one function per op for CPU and CUDA, dispatching on
// the device (run_on_device). Schemas: schema.cpp; fake kernels and autograd: python/dcnkit/ops/dcnv3.py.
#include <c10/core/DeviceGuard.h>

#include <tuple>

#include "dcnkit/dcnv3.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {
namespace {

Dcnv3Attrs attrs_of(int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                    int64_t group, int64_t group_channels, double offset_scale, int64_t remove_center) {
  return Dcnv3Attrs{kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center};
}

// Devices and dtypes: every tensor on the device and of the dtype of the first (`input` / `value`).
void check_like(const char* op, const char* first, const at::Tensor& x,
                std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  check_dtype_supported(op, x, false);
  for (const auto& o : others) {
    TORCH_CHECK_VALUE(o.second->device() == x.device(), op, ": ", o.first, ": expected a tensor on ", x.device(),
                      " (the device of ", first, "), got ", o.second->device());
    TORCH_CHECK_TYPE(o.second->scalar_type() == x.scalar_type(), op, ": ", o.first, ": expected dtype ",
                     x.scalar_type(), " (the dtype of ", first, "), got ", o.second->scalar_type());
  }
}

// The forward of both ops: `mask` is offset_mask again for DCNv4 (p.fused).
at::Tensor forward(const char* op, const Dcnv3Params& p, const at::Tensor& input_, const at::Tensor& offset_,
                   const at::Tensor& mask_) {
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), offset = offset_.contiguous();
  const at::Tensor mask = p.fused ? offset : mask_.contiguous();
  at::Tensor output = at::empty(p.output_shape(), input.options());
  if (output.numel() == 0) return output;
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return dcnv3_forward_cpu<T>(p, input.const_data_ptr<T>(), offset.const_data_ptr<T>(),
                                    mask.const_data_ptr<T>(), output.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        return dcnv3_forward_cuda(p, dtype_of(input), input.const_data_ptr(), offset.const_data_ptr(),
                                  mask.const_data_ptr(), output.mutable_data_ptr(), cuda);
      });
  return output;
}

// The backward of both ops: (grad_input, grad_offset, grad_mask); for DCNv4 grad_mask is grad_offset (the
// offset_mask gradient, padding channels 0).
std::tuple<at::Tensor, at::Tensor, at::Tensor> backward(const char* op, const Dcnv3Params& p,
                                                        const at::Tensor& grad_output_, const at::Tensor& input_,
                                                        const at::Tensor& offset_, const at::Tensor& mask_) {
  TORCH_CHECK_VALUE(shape_of(grad_output_) == p.output_shape(), op, ": grad_output: expected shape ",
                    shape_str(p.output_shape()), ", got ", shape_str(shape_of(grad_output_)));
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), offset = offset_.contiguous(), grad_output = grad_output_.contiguous();
  const at::Tensor mask = p.fused ? offset : mask_.contiguous();
  at::Tensor grad_input = at::empty_like(input), grad_offset = at::empty_like(offset);
  at::Tensor grad_mask = p.fused ? grad_offset : at::empty_like(mask);
  if (grad_output.numel() == 0 || input.numel() == 0) {
    grad_input.zero_();
    grad_offset.zero_();
    grad_mask.zero_();
    return {grad_input, grad_offset, grad_mask};
  }
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return dcnv3_backward_cpu<T>(p, grad_output.const_data_ptr<T>(), input.const_data_ptr<T>(),
                                     offset.const_data_ptr<T>(), mask.const_data_ptr<T>(),
                                     grad_input.mutable_data_ptr<T>(), grad_offset.mutable_data_ptr<T>(),
                                     grad_mask.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        at::Tensor ws = workspace_for(input, dcnv3_backward_workspace_cuda(p, dtype_of(input)));
        return dcnv3_backward_cuda(p, dtype_of(input), grad_output.const_data_ptr(), input.const_data_ptr(),
                                   offset.const_data_ptr(), mask.const_data_ptr(), grad_input.mutable_data_ptr(),
                                   grad_offset.mutable_data_ptr(), grad_mask.mutable_data_ptr(),
                                   ws.mutable_data_ptr(), cuda);
      });
  return {grad_input, grad_offset, grad_mask};
}

Dcnv3Params v3_params(const char* op, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& mask,
                      const Dcnv3Attrs& a) {
  Dcnv3Params p;
  throw_if_error(make_dcnv3_params(op, a, shape_of(input), shape_of(offset), shape_of(mask), &p));
  check_like(op, "input", input, {{"offset", &offset}, {"mask", &mask}});
  return p;
}

Dcnv3Params v4_params(const char* op, const at::Tensor& value, const at::Tensor& offset_mask, const Dcnv3Attrs& a,
                      bool softmax) {
  Dcnv3Params p;
  throw_if_error(make_dcnv4_params(op, a, softmax, shape_of(value), shape_of(offset_mask), &p));
  check_like(op, "value", value, {{"offset_mask", &offset_mask}});
  return p;
}

at::Tensor dcnv3(const at::Tensor& input, const at::Tensor& offset, const at::Tensor& mask, int64_t kh, int64_t kw,
                 int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group,
                 int64_t group_channels, double offset_scale, int64_t remove_center) {
  const char* op = "dcnv3";
  const Dcnv3Attrs a = attrs_of(kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center);
  const Dcnv3Params p = v3_params(op, input, offset, mask, a);
  if (computes_in_float32(input)) {
    return dcnv3(input.to(at::kFloat), offset.to(at::kFloat), mask.to(at::kFloat), kh, kw, sh, sw, ph, pw, dh, dw,
                 group, group_channels, offset_scale, remove_center)
        .to(input.scalar_type());
  }
  return forward(op, p, input, offset, mask);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> dcnv3_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& offset, const at::Tensor& mask,
    int64_t kh, int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group,
    int64_t group_channels, double offset_scale, int64_t remove_center) {
  const char* op = "_dcnv3_backward";
  alert_atomic_cuda_backward(op, input);
  const Dcnv3Attrs a = attrs_of(kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center);
  const Dcnv3Params p = v3_params(op, input, offset, mask, a);
  check_like(op, "input", input, {{"grad_output", &grad_output}});
  if (computes_in_float32(input)) {
    auto [gi, go, gm] = dcnv3_backward(grad_output.to(at::kFloat), input.to(at::kFloat), offset.to(at::kFloat),
                                       mask.to(at::kFloat), kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels,
                                       offset_scale, remove_center);
    const auto st = input.scalar_type();
    return {gi.to(st), go.to(st), gm.to(st)};
  }
  return backward(op, p, grad_output, input, offset, mask);
}

at::Tensor dcnv4(const at::Tensor& value, const at::Tensor& offset_mask, int64_t kh, int64_t kw, int64_t sh,
                 int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group, int64_t group_channels,
                 double offset_scale, int64_t remove_center, bool softmax) {
  const char* op = "dcnv4";
  const Dcnv3Attrs a = attrs_of(kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center);
  const Dcnv3Params p = v4_params(op, value, offset_mask, a, softmax);
  if (computes_in_float32(value)) {
    return dcnv4(value.to(at::kFloat), offset_mask.to(at::kFloat), kh, kw, sh, sw, ph, pw, dh, dw, group,
                 group_channels, offset_scale, remove_center, softmax)
        .to(value.scalar_type());
  }
  return forward(op, p, value, offset_mask, offset_mask);
}

std::tuple<at::Tensor, at::Tensor> dcnv4_backward(const at::Tensor& grad_output, const at::Tensor& value,
                                                  const at::Tensor& offset_mask, int64_t kh, int64_t kw, int64_t sh,
                                                  int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                                                  int64_t group, int64_t group_channels, double offset_scale,
                                                  int64_t remove_center, bool softmax) {
  const char* op = "_dcnv4_backward";
  alert_atomic_cuda_backward(op, value);
  const Dcnv3Attrs a = attrs_of(kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center);
  const Dcnv3Params p = v4_params(op, value, offset_mask, a, softmax);
  check_like(op, "value", value, {{"grad_output", &grad_output}});
  if (computes_in_float32(value)) {
    auto [gv, gom] = dcnv4_backward(grad_output.to(at::kFloat), value.to(at::kFloat), offset_mask.to(at::kFloat), kh,
                                    kw, sh, sw, ph, pw, dh, dw, group, group_channels, offset_scale, remove_center,
                                    softmax);
    const auto st = value.scalar_type();
    return {gv.to(st), gom.to(st)};
  }
  auto [gv, gom, unused] = backward(op, p, grad_output, value, offset_mask, offset_mask);
  (void)unused;
  return {gv, gom};
}

void register_dcnv3(torch::Library& m) {
  m.impl("dcnv3", &dcnv3);
  m.impl("_dcnv3_backward", &dcnv3_backward);
  m.impl("dcnv4", &dcnv4);
  m.impl("_dcnv4_backward", &dcnv4_backward);
}

}  // namespace
}  // namespace dcnkit::torch_binding

DCNKIT_TORCH_IMPL_CPU_CUDA(dcnkit::torch_binding::register_dcnv3)
