// The dcnkit torch operator schemas (namespace "dcnkit"). Kernels are registered per operator file
// (one function for CPU and CUDA); fake kernels and autograd are registered in Python next to each
// op's wrapper (python/dcnkit/ops/deform_conv.py, roi_ops.py) through torch.library.
#include <torch/library.h>

TORCH_LIBRARY(dcnkit, m) {
  m.def(
      "deform_conv2d(Tensor input, Tensor offset, Tensor weight, Tensor? bias, Tensor? mask, "
      "int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, "
      "int groups, int deformable_groups) -> Tensor");
  // Returns (grad_input, grad_offset, grad_weight, grad_bias, grad_mask); grad_bias / grad_mask are
  // empty (numel 0) when bias / mask are None.
  m.def(
      "_deform_conv2d_backward(Tensor grad_output, Tensor input, Tensor offset, Tensor weight, "
      "Tensor? bias, Tensor? mask, int stride_h, int stride_w, int pad_h, int pad_w, "
      "int dilation_h, int dilation_w, int groups, int deformable_groups) "
      "-> (Tensor, Tensor, Tensor, Tensor, Tensor)");

  m.def(
      "roi_align(Tensor input, Tensor rois, int pooled_h, int pooled_w, float spatial_scale, "
      "int sampling_ratio, bool aligned, str pool_mode) -> Tensor");
  m.def(
      "_roi_align_backward(Tensor grad_output, Tensor input, Tensor rois, int pooled_h, "
      "int pooled_w, float spatial_scale, int sampling_ratio, bool aligned, str pool_mode) -> Tensor");

  m.def(
      "deform_roi_pool(Tensor input, Tensor rois, Tensor? offset, int pooled_h, int pooled_w, "
      "float spatial_scale, int sampling_ratio, float gamma) -> Tensor");
  // Returns (grad_input, grad_offset); grad_offset is empty when offset is None.
  m.def(
      "_deform_roi_pool_backward(Tensor grad_output, Tensor input, Tensor rois, Tensor? offset, "
      "int pooled_h, int pooled_w, float spatial_scale, int sampling_ratio, float gamma) "
      "-> (Tensor, Tensor)");

  // Returns (output, count).
  m.def(
      "deform_psroi_pool(Tensor input, Tensor rois, Tensor? trans, float spatial_scale, "
      "int output_size, int output_dim, int group_size, int part_size, int sample_per_part, "
      "float trans_std) -> (Tensor, Tensor)");
  // Returns (grad_input, grad_trans); grad_trans is empty when trans is None.
  m.def(
      "_deform_psroi_pool_backward(Tensor grad_output, Tensor input, Tensor rois, Tensor? trans, "
      "Tensor count, float spatial_scale, int output_size, int output_dim, int group_size, "
      "int part_size, int sample_per_part, float trans_std) -> (Tensor, Tensor)");

  // features: L maps (N, C, H_l, W_l); rois (K, 5). Returns (K, C, pooled_h, pooled_w).
  m.def(
      "multi_level_roi_align(Tensor[] features, Tensor rois, int pooled_h, int pooled_w, "
      "float[] featmap_strides, int sampling_ratio, int finest_scale, float roi_scale_factor, bool aligned, "
      "str pool_mode) -> Tensor");
  // Returns the gradient of every feature map.
  m.def(
      "_multi_level_roi_align_backward(Tensor grad_output, Tensor[] features, Tensor rois, int pooled_h, "
      "int pooled_w, float[] featmap_strides, int sampling_ratio, int finest_scale, float roi_scale_factor, "
      "bool aligned, str pool_mode) -> Tensor[]");

  // value (N, S, M, D), spatial_shapes (L, 2) int64, level_start_index (L) int64, sampling_locations
  // (N, Lq, M, L, P, 2), attention_weights (N, Lq, M, L, P). Returns (N, Lq, M*D).
  m.def(
      "multi_scale_deformable_attn(Tensor value, Tensor spatial_shapes, Tensor level_start_index, "
      "Tensor sampling_locations, Tensor attention_weights) -> Tensor");
  // Returns (grad_value, grad_sampling_locations, grad_attention_weights).
  m.def(
      "_multi_scale_deformable_attn_backward(Tensor grad_output, Tensor value, Tensor spatial_shapes, "
      "Tensor level_start_index, Tensor sampling_locations, Tensor attention_weights) -> (Tensor, Tensor, Tensor)");

  // DCNv3 (InternImage): input (N, H, W, C), offset (N, Ho, Wo, G*K*2), mask (N, Ho, Wo, G*K). Returns (N, Ho, Wo, C).
  m.def(
      "dcnv3(Tensor input, Tensor offset, Tensor mask, "
      "int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, int remove_center) -> Tensor");
  // Returns (grad_input, grad_offset, grad_mask).
  m.def(
      "_dcnv3_backward(Tensor grad_output, Tensor input, Tensor offset, Tensor mask, "
      "int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, int remove_center) -> (Tensor, Tensor, Tensor)");
  // DCNv4: value (N, H, W, C), offset_mask (N, Ho, Wo, Cp). Returns (N, Ho, Wo, C).
  m.def(
      "dcnv4(Tensor value, Tensor offset_mask, "
      "int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, int remove_center, bool softmax) -> Tensor");
  // Returns (grad_value, grad_offset_mask).
  m.def(
      "_dcnv4_backward(Tensor grad_output, Tensor value, Tensor offset_mask, "
      "int kernel_h, int kernel_w, int stride_h, int stride_w, int pad_h, int pad_w, int dilation_h, int dilation_w, int group, int group_channels, float offset_scale, int remove_center, bool softmax) -> (Tensor, Tensor)");
}

namespace {
bool cuda_compiled() {
#ifdef DCNKIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(dcnkit, m) { m.def("_cuda_compiled() -> bool", &cuda_compiled); }
