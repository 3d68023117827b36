// Autocast kernels of the forward ops (AutocastCPU and AutocastCUDA), as torchvision's: under
// torch.autocast every floating tensor argument except float64 is cast to float32, the op runs below
// autocast (through the dispatcher, so autograd records it in float32), and its results are returned in
// the dtype of `input`. The backward ops need none: autograd saved float32 tensors, and the kernels
// exclude autocast for everything they call (run_on_device).
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

namespace dcnkit::torch_binding {
namespace {

template <typename Signature>
c10::TypedOperatorHandle<Signature> op_handle(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Signature>();
}

template <c10::DeviceType D>
at::Tensor f32(const at::Tensor& t) {
  return at::autocast::cached_cast(at::kFloat, t, D);
}
template <c10::DeviceType D>
std::optional<at::Tensor> f32(const std::optional<at::Tensor>& t) {
  return at::autocast::cached_cast(at::kFloat, t, D);
}

using DeformConv2dSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                   const std::optional<at::Tensor>&, const std::optional<at::Tensor>&,
                                   int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                                   int64_t);

template <c10::DeviceType D>
at::Tensor deform_conv2d_autocast(const at::Tensor& input, const at::Tensor& offset,
                                  const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                  const std::optional<at::Tensor>& mask, int64_t stride_h,
                                  int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                  int64_t dilation_w, int64_t groups, int64_t deformable_groups) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<DeformConv2dSig>("dcnkit::deform_conv2d");
  return op.call(f32<D>(input), f32<D>(offset), f32<D>(weight), f32<D>(bias), f32<D>(mask), stride_h,
                 stride_w, pad_h, pad_w, dilation_h, dilation_w, groups, deformable_groups)
      .to(input.scalar_type());
}

using RoIAlignSig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, double, int64_t,
                               bool, c10::string_view);

template <c10::DeviceType D>
at::Tensor roi_align_autocast(const at::Tensor& input, const at::Tensor& rois, int64_t pooled_h,
                              int64_t pooled_w, double spatial_scale, int64_t sampling_ratio,
                              bool aligned, c10::string_view pool_mode) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<RoIAlignSig>("dcnkit::roi_align");
  return op.call(f32<D>(input), f32<D>(rois), pooled_h, pooled_w, spatial_scale, sampling_ratio,
                 aligned, pool_mode)
      .to(input.scalar_type());
}

using DeformRoIPoolSig = at::Tensor(const at::Tensor&, const at::Tensor&,
                                    const std::optional<at::Tensor>&, int64_t, int64_t, double,
                                    int64_t, double);

template <c10::DeviceType D>
at::Tensor deform_roi_pool_autocast(const at::Tensor& input, const at::Tensor& rois,
                                    const std::optional<at::Tensor>& offset, int64_t pooled_h,
                                    int64_t pooled_w, double spatial_scale, int64_t sampling_ratio,
                                    double gamma) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<DeformRoIPoolSig>("dcnkit::deform_roi_pool");
  return op.call(f32<D>(input), f32<D>(rois), f32<D>(offset), pooled_h, pooled_w, spatial_scale,
                 sampling_ratio, gamma)
      .to(input.scalar_type());
}

using DeformPSRoIPoolSig = std::tuple<at::Tensor, at::Tensor>(
    const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, double, int64_t, int64_t,
    int64_t, int64_t, int64_t, double);

template <c10::DeviceType D>
std::tuple<at::Tensor, at::Tensor> deform_psroi_pool_autocast(
    const at::Tensor& input, const at::Tensor& rois, const std::optional<at::Tensor>& trans,
    double spatial_scale, int64_t output_size, int64_t output_dim, int64_t group_size,
    int64_t part_size, int64_t sample_per_part, double trans_std) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<DeformPSRoIPoolSig>("dcnkit::deform_psroi_pool");
  auto [out, count] = op.call(f32<D>(input), f32<D>(rois), f32<D>(trans), spatial_scale, output_size,
                              output_dim, group_size, part_size, sample_per_part, trans_std);
  return {out.to(input.scalar_type()), count.to(input.scalar_type())};
}

using MultiLevelRoIAlignSig = at::Tensor(at::TensorList, const at::Tensor&, int64_t, int64_t,
                                         c10::ArrayRef<double>, int64_t, int64_t, double, bool, c10::string_view);

template <c10::DeviceType D>
at::Tensor multi_level_roi_align_autocast(at::TensorList features, const at::Tensor& rois, int64_t pooled_h,
                                          int64_t pooled_w, c10::ArrayRef<double> featmap_strides,
                                          int64_t sampling_ratio, int64_t finest_scale, double roi_scale_factor,
                                          bool aligned, c10::string_view pool_mode) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<MultiLevelRoIAlignSig>("dcnkit::multi_level_roi_align");
  std::vector<at::Tensor> f;
  for (const at::Tensor& t : features) f.push_back(f32<D>(t));
  const at::Tensor out = op.call(f, f32<D>(rois), pooled_h, pooled_w, featmap_strides, sampling_ratio, finest_scale,
                                 roi_scale_factor, aligned, pool_mode);
  // The dtype of features[0] (an empty list reaches the kernel's error).
  return features.empty() ? out : out.to(features[0].scalar_type());
}

using MsdaSig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&);

// The level tables are int64 and pass through unchanged.
template <c10::DeviceType D>
at::Tensor msda_autocast(const at::Tensor& value, const at::Tensor& spatial_shapes, const at::Tensor& level_start_index,
                         const at::Tensor& sampling_locations, const at::Tensor& attention_weights) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<MsdaSig>("dcnkit::multi_scale_deformable_attn");
  return op.call(f32<D>(value), spatial_shapes, level_start_index, f32<D>(sampling_locations),
                 f32<D>(attention_weights))
      .to(value.scalar_type());
}

using Dcnv3Sig = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t);

template <c10::DeviceType D>
at::Tensor dcnv3_autocast(const at::Tensor& input, const at::Tensor& offset, const at::Tensor& mask, int64_t kh,
                          int64_t kw, int64_t sh, int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw,
                          int64_t group, int64_t group_channels, double offset_scale, int64_t remove_center) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<Dcnv3Sig>("dcnkit::dcnv3");
  return op.call(f32<D>(input), f32<D>(offset), f32<D>(mask), kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels,
                 offset_scale, remove_center)
      .to(input.scalar_type());
}

using Dcnv4Sig = at::Tensor(const at::Tensor&, const at::Tensor&, int64_t, int64_t, int64_t, int64_t, int64_t,
                            int64_t, int64_t, int64_t, int64_t, int64_t, double, int64_t, bool);

template <c10::DeviceType D>
at::Tensor dcnv4_autocast(const at::Tensor& value, const at::Tensor& offset_mask, int64_t kh, int64_t kw, int64_t sh,
                          int64_t sw, int64_t ph, int64_t pw, int64_t dh, int64_t dw, int64_t group,
                          int64_t group_channels, double offset_scale, int64_t remove_center, bool softmax) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  static const auto op = op_handle<Dcnv4Sig>("dcnkit::dcnv4");
  return op.call(f32<D>(value), f32<D>(offset_mask), kh, kw, sh, sw, ph, pw, dh, dw, group, group_channels,
                 offset_scale, remove_center, softmax)
      .to(value.scalar_type());
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  m.impl("deform_conv2d", TORCH_FN(deform_conv2d_autocast<D>));
  m.impl("roi_align", TORCH_FN(roi_align_autocast<D>));
  m.impl("deform_roi_pool", TORCH_FN(deform_roi_pool_autocast<D>));
  m.impl("deform_psroi_pool", TORCH_FN(deform_psroi_pool_autocast<D>));
  m.impl("multi_level_roi_align", TORCH_FN(multi_level_roi_align_autocast<D>));
  m.impl("multi_scale_deformable_attn", TORCH_FN(msda_autocast<D>));
  m.impl("dcnv3", TORCH_FN(dcnv3_autocast<D>));
  m.impl("dcnv4", TORCH_FN(dcnv4_autocast<D>));
}

}  // namespace
}  // namespace dcnkit::torch_binding

// Both keys are registered in every build: a CUDA tensor in a build without CUDA then reaches the
// kernel's "built without CUDA" error rather than a dtype error.
TORCH_LIBRARY_IMPL(dcnkit, AutocastCPU, m) {
  dcnkit::torch_binding::register_autocast<c10::DeviceType::CPU>(m);
}
TORCH_LIBRARY_IMPL(dcnkit, AutocastCUDA, m) {
  dcnkit::torch_binding::register_autocast<c10::DeviceType::CUDA>(m);
}
