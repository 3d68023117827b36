// PyTorch kernels of multi_level_roi_align and its backward op: one function per op for CPU and CUDA,
// dispatching on the device (run_on_device). Schemas: schema.cpp; fake kernels and autograd:
// python/dcnkit/ops/multi_level_roi_align.py.
#include <c10/core/DeviceGuard.h>

#include <string>
#include <vector>

#include "dcnkit/multi_level_roi_align.h"
#include "dcnkit/roi_kernels.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {
namespace {

constexpr const char* kForward = "multi_level_roi_align";
constexpr const char* kBackward = "_multi_level_roi_align_backward";

MultiLevelRoIAlignParams params_of(const char* op, at::TensorList features, const at::Tensor& rois,
                                   int64_t pooled_h, int64_t pooled_w, c10::ArrayRef<double> featmap_strides,
                                   int64_t sampling_ratio, int64_t finest_scale, double roi_scale_factor,
                                   bool aligned, c10::string_view pool_mode) {
  MultiLevelRoIAlignAttrs a;
  a.pooled_h = pooled_h;
  a.pooled_w = pooled_w;
  a.num_levels = static_cast<int64_t>(featmap_strides.size());
  for (size_t l = 0; l < featmap_strides.size() && l < static_cast<size_t>(kMaxFeatureLevels); ++l) {
    a.featmap_strides[l] = featmap_strides[l];
  }
  a.sampling_ratio = sampling_ratio;
  a.finest_scale = finest_scale;
  a.roi_scale_factor = roi_scale_factor;
  a.aligned = aligned;
  throw_if_error(parse_pool_mode(op, std::string(pool_mode.data(), pool_mode.size()), &a.mode));
  std::vector<Shape> shapes;
  for (const at::Tensor& f : features) shapes.push_back(shape_of(f));
  MultiLevelRoIAlignParams p;
  throw_if_error(make_multi_level_roi_align_params(op, shapes, shape_of(rois), a, &p));
  return p;
}

// features[0]'s dtype is supported; every other tensor has its device and dtype.
void check_tensors(const char* op, at::TensorList features,
                   std::initializer_list<std::pair<const char*, const at::Tensor*>> others) {
  const at::Tensor& x = features[0];
  check_dtype_supported(op, x, false);
  auto check = [&](const std::string& arg, const at::Tensor& t) {
    TORCH_CHECK_VALUE(t.device() == x.device(), op, ": ", arg, ": expected a tensor on ", x.device(),
                      " (the device of features[0]), got ", t.device());
    TORCH_CHECK_TYPE(t.scalar_type() == x.scalar_type(), op, ": ", arg, ": expected dtype ", x.scalar_type(),
                     " (the dtype of features[0]), got ", t.scalar_type());
  };
  for (size_t l = 1; l < features.size(); ++l) check("features[" + std::to_string(l) + "]", features[l]);
  for (const auto& o : others) check(o.first, *o.second);
}

std::vector<at::Tensor> to_float32(at::TensorList ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(t.to(at::kFloat));
  return out;
}

std::vector<at::Tensor> contiguous(at::TensorList ts) {
  std::vector<at::Tensor> out;
  for (const at::Tensor& t : ts) out.push_back(t.contiguous());
  return out;
}

template <typename T>
std::vector<const T*> const_ptrs(at::TensorList ts) {
  std::vector<const T*> out;
  for (const at::Tensor& t : ts) out.push_back(t.const_data_ptr<T>());
  return out;
}

// See roi_ops.cpp: a bad batch index on CUDA is an asynchronous device-side assert (no host sync).
void assert_batch_indices_async(const char* op, const at::Tensor& rois, int64_t batch) {
  if (rois.numel() == 0) return;
  const at::Tensor b = rois.select(1, 0);
  at::_assert_async(at::logical_and(b >= 0, b < batch).all(), roi_batch_device_message(op, batch));
}

at::Tensor multi_level_roi_align(at::TensorList features_, const at::Tensor& rois_, int64_t pooled_h,
                                 int64_t pooled_w, c10::ArrayRef<double> featmap_strides, int64_t sampling_ratio,
                                 int64_t finest_scale, double roi_scale_factor, bool aligned,
                                 c10::string_view pool_mode) {
  const char* op = kForward;
  const MultiLevelRoIAlignParams p = params_of(op, features_, rois_, pooled_h, pooled_w, featmap_strides,
                                               sampling_ratio, finest_scale, roi_scale_factor, aligned, pool_mode);
  check_tensors(op, features_, {{"rois", &rois_}});
  if (computes_in_float32(features_[0])) {
    return multi_level_roi_align(to_float32(features_), rois_.to(at::kFloat), pooled_h, pooled_w, featmap_strides,
                                 sampling_ratio, finest_scale, roi_scale_factor, aligned, pool_mode)
        .to(features_[0].scalar_type());
  }
  c10::DeviceGuard guard(features_[0].device());
  const std::vector<at::Tensor> features = contiguous(features_);
  const at::Tensor rois = rois_.contiguous();
  at::Tensor output = at::empty(p.output_shape(), features[0].options());
  if (output.numel() == 0) return output;
  run_on_device(
      op, features[0],
      [&](auto zero) {
        using T = decltype(zero);
        const std::vector<const T*> f = const_ptrs<T>(features);
        return multi_level_roi_align_forward_cpu<T>(p, f.data(), rois.const_data_ptr<T>(),
                                                    output.mutable_data_ptr<T>(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        std::vector<const void*> f;
        for (const at::Tensor& t : features) f.push_back(t.const_data_ptr());
        at::Tensor ws = workspace_for(features[0], multi_level_roi_align_workspace_cuda(p));
        return multi_level_roi_align_forward_cuda(p, dtype_of(features[0]), f.data(), rois.const_data_ptr(),
                                                  output.mutable_data_ptr(), ws.mutable_data_ptr(), cuda);
      });
  return output;
}

std::vector<at::Tensor> multi_level_roi_align_backward(const at::Tensor& grad_output_,
                                                       at::TensorList features_,
                                                       const at::Tensor& rois_, int64_t pooled_h, int64_t pooled_w,
                                                       c10::ArrayRef<double> featmap_strides, int64_t sampling_ratio,
                                                       int64_t finest_scale, double roi_scale_factor, bool aligned,
                                                       c10::string_view pool_mode) {
  const char* op = kBackward;
  // Under torch.use_deterministic_algorithms the CUDA backward takes its atomic-free path (roi_gather.h).
  const MultiLevelRoIAlignParams p = params_of(op, features_, rois_, pooled_h, pooled_w, featmap_strides,
                                               sampling_ratio, finest_scale, roi_scale_factor, aligned, pool_mode);
  check_tensors(op, features_, {{"rois", &rois_}, {"grad_output", &grad_output_}});
  TORCH_CHECK_VALUE(shape_of(grad_output_) == p.output_shape(), op, ": grad_output: expected shape ",
                    shape_str(p.output_shape()), ", got ", shape_str(shape_of(grad_output_)));
  if (computes_in_float32(features_[0])) {
    std::vector<at::Tensor> g =
        multi_level_roi_align_backward(grad_output_.to(at::kFloat), to_float32(features_), rois_.to(at::kFloat),
                                       pooled_h, pooled_w, featmap_strides, sampling_ratio, finest_scale,
                                       roi_scale_factor, aligned, pool_mode);
    for (at::Tensor& t : g) t = t.to(features_[0].scalar_type());
    return g;
  }
  c10::DeviceGuard guard(features_[0].device());
  const std::vector<at::Tensor> features = contiguous(features_);
  const at::Tensor rois = rois_.contiguous(), grad_output = grad_output_.contiguous();
  std::vector<at::Tensor> grads;
  int64_t numel = 0;
  for (const at::Tensor& t : features) {
    grads.push_back(at::empty_like(t, at::MemoryFormat::Contiguous));
    numel += t.numel();
  }
  if (numel == 0) return grads;
  if (p.num_rois == 0 || p.channels == 0) {
    for (at::Tensor& g : grads) g.zero_();
    return grads;
  }
  run_on_device(
      op, features[0],
      [&](auto zero) {
        using T = decltype(zero);
        const std::vector<const T*> f = const_ptrs<T>(features);
        std::vector<T*> g;
        for (at::Tensor& t : grads) g.push_back(t.mutable_data_ptr<T>());
        return multi_level_roi_align_backward_cpu<T>(p, grad_output.const_data_ptr<T>(), f.data(),
                                                     rois.const_data_ptr<T>(), g.data(), cpu_context());
      },
      [&](const CudaContext& cuda) {
        assert_batch_indices_async(op, rois, p.batch);
        std::vector<const void*> f;
        std::vector<void*> g;
        for (const at::Tensor& t : features) f.push_back(t.const_data_ptr());
        for (at::Tensor& t : grads) g.push_back(t.mutable_data_ptr());
        at::Tensor ws =
            workspace_for(features[0],
                          multi_level_roi_align_backward_workspace_cuda(p, dtype_of(features[0]), cuda.deterministic));
        return multi_level_roi_align_backward_cuda(p, dtype_of(features[0]), grad_output.const_data_ptr(), f.data(),
                                                   rois.const_data_ptr(), g.data(), ws.mutable_data_ptr(), cuda);
      });
  return grads;
}

void register_multi_level_roi_align(torch::Library& m) {
  m.impl("multi_level_roi_align", &multi_level_roi_align);
  m.impl("_multi_level_roi_align_backward", &multi_level_roi_align_backward);
}

}  // namespace
}  // namespace dcnkit::torch_binding

DCNKIT_TORCH_IMPL_CPU_CUDA(dcnkit::torch_binding::register_multi_level_roi_align)
