// Quantized DeformConv2d (QDeformConv2d, docs/operators.md) on the CPU: 8-bit input and output, int8 weights
// per output channel, float offsets and mask.
//
// The input is sampled once per (sampling point, channel) by the float kernel's sampling plan
// (deform_conv2d_cpu_common.h: build_columns_with), bilinearly on the zero-point-shifted values, and rounded back
// to the input's quantization grid: the columns stay 8-bit. An int8 GEMM with int32 accumulation (the front end's,
// e.g. oneDNN's dnnl_gemm_u8s8s32) multiplies them by the weight; each int32 sum is requantized to the output
// (round half to even, saturated).
//
// An int8 input is handled as uint8 (value + 128, zero point + 128: the same real values), so one u8 x s8 GEMM
// serves both; the output is written in the output's own type.
#pragma once

#include <cstdint>
#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "dcnkit/deform_conv2d.h"

namespace dcnkit {

// C (m x n, int32, row-major, ldc) = (A - a_zero) * B^T: A (m x k) uint8 (lda), B (n x k) int8 (ldb).
// Single-threaded: called from inside the context's parallel_for bodies.
struct QGemmArgs {
  int64_t m = 0, n = 0, k = 0;
  const uint8_t* a = nullptr;
  int64_t lda = 0;
  uint8_t a_zero = 0;
  const int8_t* b = nullptr;
  int64_t ldb = 0;
  int32_t* c = nullptr;
  int64_t ldc = 0;
};
using QGemmFn = Status (*)(void* self, const QGemmArgs& args);

// The quantization of one call. Real values: x = x_scale * (q - x_zero), w = w_scale[oc] * q (symmetric
// weights), y = y_scale * (q - y_zero).
struct DeformConv2dQuant {
  bool x_signed = false;  // int8 input (else uint8)
  bool y_signed = false;  // int8 output (else uint8)
  int32_t x_zero = 0;     // in the input's own range
  int32_t y_zero = 0;     // in the output's own range
  // Per output channel: the int32 sum's factor x_scale * w_scale[oc] / y_scale, and the bias in output steps
  // (bias[oc] / y_scale, 0 without bias); requant_table fills them.
  const float* out_mult = nullptr;
  const float* out_bias = nullptr;
};

// out_mult and out_bias (Cout each) from the scales and the bias: a float bias (real values), or an int32 bias
// in steps of x_scale * w_scale[oc] (QLinearConv's convention), or none.
void deform_conv2d_quant_requant_table(int64_t out_channels, float x_scale, const float* w_scale, float y_scale,
                                       const float* bias_f32, const int32_t* bias_i32, float* out_mult,
                                       float* out_bias);

// Bytes of workspace for deform_conv2d_forward_quant_cpu with this context.
size_t deform_conv2d_forward_quant_workspace_cpu(const DeformConv2dParams& p, const CpuContext& ctx);

// input (N, Cin, H, W) uint8/int8 as q.x_signed; offset, mask (may be null) float32; weight_kc the int8 weight in
// the CPU forward's layout (Cout, kh*kw, Cin/groups) (deform_conv2d_weight_kc_cpu<int8_t>); output (N, Cout, Ho, Wo)
// uint8/int8 as q.y_signed.
Status deform_conv2d_forward_quant_cpu(const DeformConv2dParams& p, const DeformConv2dQuant& q, const void* input,
                                       const float* offset, const int8_t* weight_kc, const float* mask, void* output,
                                       void* workspace, const CpuContext& ctx, QGemmFn gemm, void* gemm_self);

// The weight (Cout, Cin/groups, kh, kw) int8 into the forward's layout (Cout, kh*kw, Cin/groups).
void deform_conv2d_weight_kc_quant_cpu(int64_t out_channels, int64_t in_per_group, int64_t kernel_size,
                                       const int8_t* weight, int8_t* weight_kc);

struct AttrValue;
// The params of a DeformConv2d call from the op table's canonical attribute values and the shapes of its canonical
// inputs (null: absent), checked by the core (defined by its declaration, plugins/core/ops/deform_conv2d.cpp): how
// QDeformConv2d, which has DeformConv2d's attributes, reads them.
Status deform_conv2d_params_from(const char* op, const AttrValue* attrs, const Shape* const* in,
                                 DeformConv2dParams* p);

}  // namespace dcnkit
