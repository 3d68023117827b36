// DeformConv2d (DCNv1) and modulated DeformConv2d (DCNv2): one operator, mask optional. See docs/operators.md.
//
// Tensor order everywhere in dcnkit (torch op, ONNX custom node, ORT kernel, TensorRT plugin):
//   input (N, Cin, H, W), offset (N, 2*Gd*kh*kw, Ho, Wo), weight (Cout, Cin/groups, kh, kw),
//   bias (Cout) optional, mask (N, Gd*kh*kw, Ho, Wo) optional  ->  output (N, Cout, Ho, Wo)
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/context.h"

namespace dcnkit {

struct DeformConv2dAttrs {
  int64_t stride_h = 1, stride_w = 1;
  int64_t pad_h = 0, pad_w = 0;
  int64_t dilation_h = 1, dilation_w = 1;
  int64_t groups = 1;
  int64_t deformable_groups = 1;
};

struct DeformConv2dParams {
  DeformConv2dAttrs attrs;
  int64_t batch = 0, in_channels = 0, height = 0, width = 0;
  int64_t out_channels = 0, kernel_h = 0, kernel_w = 0;
  int64_t out_h = 0, out_w = 0;
  bool has_bias = false, has_mask = false;

  int64_t kernel_size() const { return kernel_h * kernel_w; }
  int64_t in_per_group() const { return in_channels / attrs.groups; }
  int64_t out_per_group() const { return out_channels / attrs.groups; }
  int64_t in_per_deformable_group() const { return in_channels / attrs.deformable_groups; }
  int64_t out_spatial() const { return out_h * out_w; }
  Shape output_shape() const { return {batch, out_channels, out_h, out_w}; }
};

// Validates shapes and attributes (docs/operators.md: "Bad input") and fills `p`. `mask`/`bias` may be null.
// `op` names the entry point in error messages (e.g. "deform_conv2d").
Status make_deform_conv2d_params(const char* op, const Shape& input, const Shape& offset,
                                 const Shape& weight, const Shape* bias, const Shape* mask,
                                 const DeformConv2dAttrs& attrs, DeformConv2dParams* p);

// The output-size rule, floor((in + 2p - (d(k-1)+1)) / s) + 1, written once over an arithmetic `A` that
// provides Value, constant(int64_t), add, sub, mul and floor_div: plain integers here (IntArith), and
// TensorRT's symbolic dimension expressions in the TensorRT plugin (its IExprBuilder).
template <typename A>
typename A::Value deform_conv2d_out_size_rule(A& a, typename A::Value in, typename A::Value k, int64_t s,
                                              int64_t p, int64_t d) {
  const typename A::Value one = a.constant(1);
  const typename A::Value span = a.add(a.mul(a.constant(d), a.sub(k, one)), one);
  return a.add(a.floor_div(a.sub(a.add(in, a.constant(2 * p)), span), a.constant(s)), one);
}

struct IntArith {
  using Value = int64_t;
  Value constant(int64_t v) const { return v; }
  Value add(Value x, Value y) const { return x + y; }
  Value sub(Value x, Value y) const { return x - y; }
  Value mul(Value x, Value y) const { return x * y; }
  Value floor_div(Value x, Value y) const {  // y > 0
    const Value q = x / y;
    return (x % y != 0 && (x < 0) != (y < 0)) ? q - 1 : q;
  }
};

// Output spatial size (shape inference and params): the rule on integers.
inline int64_t deform_conv2d_out_size(int64_t in, int64_t k, int64_t s, int64_t p, int64_t d) {
  IntArith a;
  return deform_conv2d_out_size_rule(a, in, k, s, p, d);
}

// ---- CPU (float32, float64) ----------------------------------------------------------------------
// Workspace bytes for forward / backward with the context the launcher will get (its num_threads tasks,
// its GEMM's preferred width).
size_t deform_conv2d_forward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx);
size_t deform_conv2d_backward_workspace_cpu(const DeformConv2dParams& p, DType dtype, const CpuContext& ctx);

// weight_kc: `weight` already in the launcher's layout (deform_conv2d_weight_kc_cpu), or null (the launcher
// reorders `weight` on every call). weight_packed (with weight_kc): weight_kc packed by the context's GEMM
// (GemmArgs::a_packed; a GemmOperand of `groups` matrices (Cout/groups) x (kh*kw*Cin/groups)), or null.
template <typename T>
Status deform_conv2d_forward_cpu(const DeformConv2dParams& p, const T* input, const T* offset,
                                 const T* weight, const T* bias, const T* mask, T* output,
                                 void* workspace, const CpuContext& ctx, const T* weight_kc = nullptr,
                                 const void* weight_packed = nullptr);

// The weight (Cout, Cin/groups, kh, kw) in the CPU forward's layout (Cout, kh*kw, Cin/groups), into
// weight_kc (as many elements). A front end whose weight is constant (an ONNX initializer) reorders it once;
// for a 512-channel 3x3 layer the per-call reorder costs as much as a 10x10 map's sampling and more.
template <typename T>
void deform_conv2d_weight_kc_cpu(int64_t out_channels, int64_t in_per_group, int64_t kernel_size, const T* weight,
                                 T* weight_kc);

// Any grad_* pointer may be null (not wanted). Gradients are written, not accumulated.
template <typename T>
Status deform_conv2d_backward_cpu(const DeformConv2dParams& p, const T* grad_output, const T* input,
                                  const T* offset, const T* weight, const T* mask, T* grad_input,
                                  T* grad_offset, T* grad_weight, T* grad_bias, T* grad_mask,
                                  void* workspace, const CpuContext& ctx);

// ---- CUDA (float32, float64, float16, bfloat16; forward and backward) --------------------------------
// 16-bit backward: float32 accumulation of grad_input and grad_weight in the backward workspace.
// The dtype is passed explicitly and pointers are untyped so this header needs no CUDA headers.
size_t deform_conv2d_forward_workspace_cuda(const DeformConv2dParams& p, DType dtype);
// The backward's workspace holds the deterministic path's plan and sort scratch only where that path runs: with
// `deterministic` (it must match the launch's CudaContext::deterministic), and on maps of one row or column.
size_t deform_conv2d_backward_workspace_cuda(const DeformConv2dParams& p, DType dtype, bool deterministic = false);
// An upper bound of deform_conv2d_forward_workspace_cuda(q, dtype) over every q whose dims are at most
// those of `max_params` (TensorRT sizes its workspace once per optimisation profile, from its max dims).
size_t deform_conv2d_forward_workspace_cuda_bound(const DeformConv2dParams& max_params, DType dtype);

Status deform_conv2d_forward_cuda(const DeformConv2dParams& p, DType dtype, const void* input,
                                  const void* offset, const void* weight, const void* bias,
                                  const void* mask, void* output, void* workspace,
                                  const CudaContext& ctx);

Status deform_conv2d_backward_cuda(const DeformConv2dParams& p, DType dtype, const void* grad_output,
                                   const void* input, const void* offset, const void* weight,
                                   const void* mask, void* grad_input, void* grad_offset,
                                   void* grad_weight, void* grad_bias, void* grad_mask,
                                   void* workspace, const CudaContext& ctx);

}  // namespace dcnkit
