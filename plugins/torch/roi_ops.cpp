// PyTorch kernels of roi_align, deform_roi_pool and deform_psroi_pool (and their backward ops): one
// function per op for CPU and CUDA, dispatching on the device (run_on_device). Schemas: schema.cpp;
// fake kernels and autograd: python/dcnkit/ops/roi_ops.py.
#include <c10/core/DeviceGuard.h>

#include <string>

#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/roi_align.h"
#include "dcnkit/roi_kernels.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {
namespace {

void check_grad_output(const char* op, const at::Tensor& grad_output, const Shape& expected) {
  TORCH_CHECK_VALUE(shape_of(grad_output) == expected, op, ": grad_output: expected shape ",
                    shape_str(expected), ", got ", shape_str(shape_of(grad_output)));
}

// CUDA: the launchers give zeros for a RoI whose batch index is outside [0, N) or NaN and never
// synchronise; the op reports such a RoI as torch reports a bad index: an asynchronous device-side assert
// (no host sync, capturable in a CUDA graph; the error surfaces at the next synchronisation).
void assert_batch_indices_async(const char* op, const at::Tensor& rois, int64_t batch) {
  if (rois.numel() == 0) return;
  const at::Tensor b = rois.select(1, 0);
  at::_assert_async(at::logical_and(b >= 0, b < batch).all(), roi_batch_device_message(op, batch));
}

// RoIAlign's CUDA kernels raise that assert themselves (no extra ATen ops per call): the params flag.
RoIAlignParams with_batch_assert(RoIAlignParams p) {
  p.assert_batch_index = true;
  return p;
}

// The gradient buffer of an optional input: shaped like it, or empty (numel 0) when it is absent.
at::Tensor grad_of_optional(const at::Tensor& t, const at::Tensor& input) {
  return t.defined() ? at::empty_like(t, at::MemoryFormat::Contiguous) : input.new_empty({0});
}

// ---- roi_align --------------------------------------------------------------------------------

RoIAlignParams roi_align_params(const char* op, const at::Tensor& input, const at::Tensor& rois,
                                int64_t pooled_h, int64_t pooled_w, double spatial_scale,
                                int64_t sampling_ratio, bool aligned, c10::string_view pool_mode) {
  RoIAlignAttrs a;
  a.pooled_h = pooled_h;
  a.pooled_w = pooled_w;
  a.spatial_scale = spatial_scale;
  a.sampling_ratio = sampling_ratio;
  a.aligned = aligned;
  throw_if_error(parse_pool_mode(op, std::string(pool_mode.data(), pool_mode.size()), &a.mode));
  RoIAlignParams p;
  throw_if_error(make_roi_align_params(op, shape_of(input), shape_of(rois), a, &p));
  return p;
}

at::Tensor roi_align(const at::Tensor& input_, const at::Tensor& rois_, int64_t pooled_h,
                     int64_t pooled_w, double spatial_scale, int64_t sampling_ratio, bool aligned,
                     c10::string_view pool_mode) {
  const char* op = "roi_align";
  check_inputs(op, input_, false, {{"rois", &rois_}});
  if (computes_in_float32(input_)) {
    return roi_align(to_float32(input_), to_float32(rois_), pooled_h, pooled_w, spatial_scale,
                     sampling_ratio, aligned, pool_mode)
        .to(input_.scalar_type());
  }
  const RoIAlignParams p = roi_align_params(op, input_, rois_, pooled_h, pooled_w, spatial_scale,
                                            sampling_ratio, aligned, pool_mode);
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  at::Tensor output = at::empty(p.output_shape(), input.options());
  if (output.numel() == 0) return output;
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return roi_align_forward_cpu<T>(p, input.const_data_ptr<T>(), rois.const_data_ptr<T>(),
                                        output.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        at::Tensor ws = workspace_for(input, roi_align_workspace_cuda(p));
        return roi_align_forward_cuda(with_batch_assert(p), dtype_of(input), input.const_data_ptr(),
                                      rois.const_data_ptr(), output.mutable_data_ptr(),
                                      ws.mutable_data_ptr(), cuda);
      });
  return output;
}

at::Tensor roi_align_backward(const at::Tensor& grad_output_, const at::Tensor& input_,
                              const at::Tensor& rois_, int64_t pooled_h, int64_t pooled_w,
                              double spatial_scale, int64_t sampling_ratio, bool aligned,
                              c10::string_view pool_mode) {
  const char* op = "_roi_align_backward";
  check_inputs(op, input_, true, {{"rois", &rois_}, {"grad_output", &grad_output_}});
  if (computes_in_float32(input_)) {
    return roi_align_backward(to_float32(grad_output_), to_float32(input_), to_float32(rois_),
                              pooled_h, pooled_w, spatial_scale, sampling_ratio, aligned, pool_mode)
        .to(input_.scalar_type());
  }
  const RoIAlignParams p = roi_align_params(op, input_, rois_, pooled_h, pooled_w, spatial_scale,
                                            sampling_ratio, aligned, pool_mode);
  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (roi_gather.h), for any
  // valid input.
  check_grad_output(op, grad_output_, p.output_shape());
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  const at::Tensor grad_output = grad_output_.contiguous();
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  if (grad_input.numel() == 0) return grad_input;
  if (p.num_rois == 0) return grad_input.zero_();
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return roi_align_backward_cpu<T>(p, grad_output.const_data_ptr<T>(),
                                         input.const_data_ptr<T>(), rois.const_data_ptr<T>(),
                                         grad_input.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        at::Tensor ws = workspace_for(input, roi_align_backward_workspace_cuda(p, dtype_of(input), cuda.deterministic));
        return roi_align_backward_cuda(with_batch_assert(p), dtype_of(input), grad_output.const_data_ptr(),
                                       input.const_data_ptr(), rois.const_data_ptr(),
                                       grad_input.mutable_data_ptr(), ws.mutable_data_ptr(), cuda);
      });
  return grad_input;
}

// ---- deform_roi_pool --------------------------------------------------------------------------

DeformRoIPoolParams deform_roi_pool_params(const char* op, const at::Tensor& input,
                                           const at::Tensor& rois, const at::Tensor& offset,
                                           int64_t pooled_h, int64_t pooled_w,
                                           double spatial_scale, int64_t sampling_ratio,
                                           double gamma) {
  DeformRoIPoolAttrs a;
  a.pooled_h = pooled_h;
  a.pooled_w = pooled_w;
  a.spatial_scale = spatial_scale;
  a.sampling_ratio = sampling_ratio;
  a.gamma = gamma;
  DeformRoIPoolParams p;
  const Shape off = offset.defined() ? shape_of(offset) : Shape();
  throw_if_error(make_deform_roi_pool_params(op, shape_of(input), shape_of(rois),
                                             offset.defined() ? &off : nullptr, a, &p));
  return p;
}

at::Tensor deform_roi_pool(const at::Tensor& input_, const at::Tensor& rois_,
                           const std::optional<at::Tensor>& offset_, int64_t pooled_h,
                           int64_t pooled_w, double spatial_scale, int64_t sampling_ratio,
                           double gamma) {
  const char* op = "deform_roi_pool";
  const at::Tensor offset = contiguous_or_undefined(offset_);
  check_inputs(op, input_, false, {{"rois", &rois_}, {"offset", &offset}});
  if (computes_in_float32(input_)) {
    return deform_roi_pool(to_float32(input_), to_float32(rois_), to_float32(offset_), pooled_h,
                           pooled_w, spatial_scale, sampling_ratio, gamma)
        .to(input_.scalar_type());
  }
  const DeformRoIPoolParams p = deform_roi_pool_params(op, input_, rois_, offset, pooled_h,
                                                       pooled_w, spatial_scale, sampling_ratio, gamma);
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  at::Tensor output = at::empty(p.output_shape(), input.options());
  if (output.numel() == 0) return output;
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return deform_roi_pool_forward_cpu<T>(p, input.const_data_ptr<T>(), rois.const_data_ptr<T>(),
                                              ptr_or_null<T>(offset), output.mutable_data_ptr<T>(),
                                              cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        at::Tensor ws = workspace_for(input, deform_roi_pool_workspace_cuda(p));
        return deform_roi_pool_forward_cuda(p, dtype_of(input), input.const_data_ptr(),
                                            rois.const_data_ptr(), vptr_or_null(offset),
                                            output.mutable_data_ptr(), ws.mutable_data_ptr(), cuda);
      });
  return output;
}

std::tuple<at::Tensor, at::Tensor> deform_roi_pool_backward(
    const at::Tensor& grad_output_, const at::Tensor& input_, const at::Tensor& rois_,
    const std::optional<at::Tensor>& offset_, int64_t pooled_h, int64_t pooled_w,
    double spatial_scale, int64_t sampling_ratio, double gamma) {
  const char* op = "_deform_roi_pool_backward";  // deterministic mode: the atomic-free path (roi_gather.h)
  const at::Tensor offset = contiguous_or_undefined(offset_);
  check_inputs(op, input_, true,
               {{"rois", &rois_}, {"offset", &offset}, {"grad_output", &grad_output_}});
  if (computes_in_float32(input_)) {
    auto [gi, go] = deform_roi_pool_backward(to_float32(grad_output_), to_float32(input_),
                                             to_float32(rois_), to_float32(offset_), pooled_h,
                                             pooled_w, spatial_scale, sampling_ratio, gamma);
    return {gi.to(input_.scalar_type()), go.to(input_.scalar_type())};
  }
  const DeformRoIPoolParams p = deform_roi_pool_params(op, input_, rois_, offset, pooled_h,
                                                       pooled_w, spatial_scale, sampling_ratio, gamma);
  check_grad_output(op, grad_output_, p.output_shape());
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  const at::Tensor grad_output = grad_output_.contiguous();
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor grad_offset = grad_of_optional(offset, input);
  if (p.num_rois == 0 || p.channels == 0) return {grad_input.zero_(), grad_offset.zero_()};
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return deform_roi_pool_backward_cpu<T>(
            p, grad_output.const_data_ptr<T>(), input.const_data_ptr<T>(), rois.const_data_ptr<T>(),
            ptr_or_null<T>(offset), grad_input.mutable_data_ptr<T>(),
            offset.defined() ? grad_offset.mutable_data_ptr<T>() : nullptr, cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        at::Tensor ws = workspace_for(input, deform_roi_pool_backward_workspace_cuda(p, dtype_of(input), cuda.deterministic));
        return deform_roi_pool_backward_cuda(
            p, dtype_of(input), grad_output.const_data_ptr(), input.const_data_ptr(),
            rois.const_data_ptr(), vptr_or_null(offset), grad_input.mutable_data_ptr(),
            offset.defined() ? grad_offset.mutable_data_ptr() : nullptr, ws.mutable_data_ptr(),
            cuda);
      });
  return {grad_input, grad_offset};
}

// ---- deform_psroi_pool ------------------------------------------------------------------------

DeformPSRoIPoolParams deform_psroi_pool_params(const char* op, const at::Tensor& input,
                                               const at::Tensor& rois, const at::Tensor& trans,
                                               double spatial_scale, int64_t output_size,
                                               int64_t output_dim, int64_t group_size,
                                               int64_t part_size, int64_t sample_per_part,
                                               double trans_std) {
  DeformPSRoIPoolAttrs a;
  a.spatial_scale = spatial_scale;
  a.output_size = output_size;
  a.output_dim = output_dim;
  a.group_size = group_size;
  a.part_size = part_size;
  a.sample_per_part = sample_per_part;
  a.trans_std = trans_std;
  a.no_trans = !trans.defined();
  DeformPSRoIPoolParams p;
  const Shape tr = trans.defined() ? shape_of(trans) : Shape();
  throw_if_error(make_deform_psroi_pool_params(op, shape_of(input), shape_of(rois),
                                               trans.defined() ? &tr : nullptr, a, &p));
  return p;
}

std::tuple<at::Tensor, at::Tensor> deform_psroi_pool(
    const at::Tensor& input_, const at::Tensor& rois_, const std::optional<at::Tensor>& trans_,
    double spatial_scale, int64_t output_size, int64_t output_dim, int64_t group_size,
    int64_t part_size, int64_t sample_per_part, double trans_std) {
  const char* op = "deform_psroi_pool";
  const at::Tensor trans = contiguous_or_undefined(trans_);
  check_inputs(op, input_, false, {{"rois", &rois_}, {"trans", &trans}});
  if (computes_in_float32(input_)) {
    auto [out, count] = deform_psroi_pool(to_float32(input_), to_float32(rois_), to_float32(trans_),
                                          spatial_scale, output_size, output_dim, group_size,
                                          part_size, sample_per_part, trans_std);
    return {out.to(input_.scalar_type()), count.to(input_.scalar_type())};
  }
  const DeformPSRoIPoolParams p =
      deform_psroi_pool_params(op, input_, rois_, trans, spatial_scale, output_size, output_dim,
                               group_size, part_size, sample_per_part, trans_std);
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  at::Tensor output = at::empty(p.output_shape(), input.options());
  at::Tensor count = at::empty(p.output_shape(), input.options());
  if (output.numel() == 0) return {output, count};
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return deform_psroi_pool_forward_cpu<T>(
            p, input.const_data_ptr<T>(), rois.const_data_ptr<T>(), ptr_or_null<T>(trans),
            output.mutable_data_ptr<T>(), count.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        at::Tensor ws = workspace_for(input, deform_psroi_pool_workspace_cuda(p));
        return deform_psroi_pool_forward_cuda(
            p, dtype_of(input), input.const_data_ptr(), rois.const_data_ptr(), vptr_or_null(trans),
            output.mutable_data_ptr(), count.mutable_data_ptr(), ws.mutable_data_ptr(), cuda);
      });
  return {output, count};
}

std::tuple<at::Tensor, at::Tensor> deform_psroi_pool_backward(
    const at::Tensor& grad_output_, const at::Tensor& input_, const at::Tensor& rois_,
    const std::optional<at::Tensor>& trans_, const at::Tensor& count_, double spatial_scale,
    int64_t output_size, int64_t output_dim, int64_t group_size, int64_t part_size,
    int64_t sample_per_part, double trans_std) {
  const char* op = "_deform_psroi_pool_backward";  // deterministic mode: the atomic-free path (psroi_gather.h)
  const at::Tensor trans = contiguous_or_undefined(trans_);
  check_inputs(op, input_, true,
               {{"rois", &rois_}, {"trans", &trans}, {"grad_output", &grad_output_},
                {"count", &count_}});
  if (computes_in_float32(input_)) {
    auto [gi, gt] = deform_psroi_pool_backward(
        to_float32(grad_output_), to_float32(input_), to_float32(rois_), to_float32(trans_),
        to_float32(count_), spatial_scale, output_size, output_dim, group_size, part_size,
        sample_per_part, trans_std);
    return {gi.to(input_.scalar_type()), gt.to(input_.scalar_type())};
  }
  const DeformPSRoIPoolParams p =
      deform_psroi_pool_params(op, input_, rois_, trans, spatial_scale, output_size, output_dim,
                               group_size, part_size, sample_per_part, trans_std);
  check_grad_output(op, grad_output_, p.output_shape());
  TORCH_CHECK_VALUE(shape_of(count_) == p.output_shape(), op, ": count: expected shape ",
                    shape_str(p.output_shape()), ", got ", shape_str(shape_of(count_)));
  c10::DeviceGuard guard(input_.device());
  const at::Tensor input = input_.contiguous(), rois = rois_.contiguous();
  const at::Tensor grad_output = grad_output_.contiguous(), count = count_.contiguous();
  at::Tensor grad_input = at::empty_like(input, at::MemoryFormat::Contiguous);
  at::Tensor grad_trans = grad_of_optional(trans, input);
  if (p.num_rois == 0 || p.channels == 0) return {grad_input.zero_(), grad_trans.zero_()};
  run_on_device(
      op, input,
      [&](auto zero) {
        using T = decltype(zero);
        return deform_psroi_pool_backward_cpu<T>(
            p, grad_output.const_data_ptr<T>(), input.const_data_ptr<T>(), rois.const_data_ptr<T>(),
            ptr_or_null<T>(trans), count.const_data_ptr<T>(), grad_input.mutable_data_ptr<T>(),
            trans.defined() ? grad_trans.mutable_data_ptr<T>() : nullptr, cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        at::Tensor ws =
            workspace_for(input, deform_psroi_pool_backward_workspace_cuda(p, dtype_of(input), cuda.deterministic));
        return deform_psroi_pool_backward_cuda(
            p, dtype_of(input), grad_output.const_data_ptr(), input.const_data_ptr(),
            rois.const_data_ptr(), vptr_or_null(trans), count.const_data_ptr(),
            grad_input.mutable_data_ptr(), trans.defined() ? grad_trans.mutable_data_ptr() : nullptr,
            ws.mutable_data_ptr(), cuda);
      });
  return {grad_input, grad_trans};
}

void register_roi_ops(torch::Library& m) {
  m.impl("roi_align", &roi_align);
  m.impl("_roi_align_backward", &roi_align_backward);
  m.impl("deform_roi_pool", &deform_roi_pool);
  m.impl("_deform_roi_pool_backward", &deform_roi_pool_backward);
  m.impl("deform_psroi_pool", &deform_psroi_pool);
  m.impl("_deform_psroi_pool_backward", &deform_psroi_pool_backward);
}

}  // namespace
}  // namespace dcnkit::torch_binding

DCNKIT_TORCH_IMPL_CPU_CUDA(dcnkit::torch_binding::register_roi_ops)
