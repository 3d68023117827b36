// DCNv3 (InternImage) and DCNv4 (FlashInternImage): channels-last deformable sampling without a weight, one
// core for both (docs/operators.md).
//   x (N, H, W, C), C = G * gc; K = kh*kw points (minus the centre when remove_center), enumerated w-major
//   (k = i_w * kh + i_h, the centre skipped); for output (n, ho, wo), group g, channel c of the group:
//   x_k = wo*sw - pw + (dw*(kw-1))//2 + (i_w*dw - (dw*(kw-1))//2 + dx_k) * s   (y likewise, with h)
//   out[n, ho, wo, g*gc + c] = sum_k m_k * S_zero(x[n, :, :, g*gc + c], y_k, x_k)
// with S_zero bilinear, zeros outside, pixel centres at integers (bilinear.h's dcn_taps). DCNv3 reads offsets
// (N, Ho, Wo, G*K*2) laid out [g][k][dx, dy] and weights m (N, Ho, Wo, G*K) laid out [g][k]; DCNv4 reads both
// from one tensor offset_mask (N, Ho, Wo, Cp): per group 2K offsets then K weights, Cp = G*3K rounded up to a
// multiple of 8, and with `softmax` uses softmax over the K weights of each group.
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

struct Dcnv3Params {
  int64_t batch = 0, height = 0, width = 0;
  int64_t groups = 1, group_channels = 1;
  int64_t kernel_h = 1, kernel_w = 1, stride_h = 1, stride_w = 1, pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  double offset_scale = 1.0;
  bool remove_center = false;
  bool softmax = false;  // DCNv4 only
  int64_t out_h = 0, out_w = 0;
  int64_t points = 1;  // K
  // Where the offsets and weights of output position pos = (n*Ho + ho)*Wo + wo, group g, point k are:
  //   offset[pos*offset_row + g*offset_group + 2k + {0: dx, 1: dy}],
  //   weight[mask_base + pos*mask_row + g*mask_group + k]  (DCNv4: in the offset_mask tensor itself).
  int64_t offset_row = 0, offset_group = 0, mask_row = 0, mask_group = 0, mask_base = 0;
  bool fused = false;  // DCNv4: offsets and weights in one tensor

  int64_t channels() const { return groups * group_channels; }
  Shape input_shape() const { return {batch, height, width, channels()}; }
  Shape output_shape() const { return {batch, out_h, out_w, channels()}; }
};

// The attributes shared by both ops (InternImage's names).
struct Dcnv3Attrs {
  int64_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w, group, group_channels;
  double offset_scale;
  int64_t remove_center;
};

// Checks the attributes alone: sizes, strides, dilations, group and group_channels >= 1 (each at most 2^24,
// kernel_h*kernel_w at most 2^24), pads >= 0, remove_center 0 or 1 (with an odd kernel of more than one point),
// a finite offset_scale.
Status check_dcnv3_attrs(const char* op, const Dcnv3Attrs& a);

// Checks attributes and shapes once. DCNv3: input (N, H, W, C), offset (N, Ho, Wo, G*K*2), mask (N, Ho, Wo, G*K).
Status make_dcnv3_params(const char* op, const Dcnv3Attrs& a, const Shape& input, const Shape& offset,
                         const Shape& mask, Dcnv3Params* p);
// DCNv4: value (N, H, W, C), offset_mask (N, Ho, Wo, Cp) with Cp = G*3K rounded up to a multiple of 8.
Status make_dcnv4_params(const char* op, const Dcnv3Attrs& a, bool softmax, const Shape& value,
                         const Shape& offset_mask, Dcnv3Params* p);
// Cp of DCNv4's offset_mask for G groups of K points.
inline int64_t dcnv4_offset_mask_channels(int64_t groups, int64_t points) { return (groups * 3 * points + 7) / 8 * 8; }

// CPU (float32, float64). `mask` is the weights tensor (DCNv3) or offset_mask again (DCNv4: p.fused).
template <typename T>
Status dcnv3_forward_cpu(const Dcnv3Params& p, const T* input, const T* offset, const T* mask, T* output,
                         const CpuContext& ctx);
// Writes grad_input, grad_offset and grad_mask (DCNv4: grad_mask == grad_offset, the offset_mask gradient, its
// padding channels 0). Each (n, ho, wo) row of the offset/mask gradients is written by one task; grad_input is
// accumulated per image by one task: the result does not depend on the thread count.
template <typename T>
Status dcnv3_backward_cpu(const Dcnv3Params& p, const T* grad_output, const T* input, const T* offset, const T* mask,
                          T* grad_input, T* grad_offset, T* grad_mask, const CpuContext& ctx);

// CUDA (float32, float64, float16, bfloat16; 16-bit data accumulates in float32). No synchronisation, no
// allocation. The backward scatters grad_input with atomic adds (float32 workspace for 16-bit types:
// dcnv3_backward_workspace_cuda bytes).
size_t dcnv3_backward_workspace_cuda(const Dcnv3Params& p, DType dtype);
Status dcnv3_forward_cuda(const Dcnv3Params& p, DType dtype, const void* input, const void* offset, const void* mask,
                          void* output, const CudaContext& ctx);
Status dcnv3_backward_cuda(const Dcnv3Params& p, DType dtype, const void* grad_output, const void* input,
                           const void* offset, const void* mask, void* grad_input, void* grad_offset, void* grad_mask,
                           void* workspace, const CudaContext& ctx);

}  // namespace dcnkit
