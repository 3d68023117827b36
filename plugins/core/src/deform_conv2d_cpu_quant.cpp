// Quantized DeformConv2d CPU forward (dcnkit/deform_conv2d_quant.h). The layout is the float forward's
// (deform_conv2d_cpu_common.h): the image channels-last, tiles of position-major columns built by the same
// sampling plan (build_columns_with), here 8-bit; per tile one u8 x s8 -> s32 GEMM per conv group into a
// position-major int32 tile, requantized into the (Cout, P) output.
#include <atomic>
#include <cmath>

#include "dcnkit/deform_conv2d_quant.h"
#include "deform_conv2d_cpu_common.h"

namespace dcnkit {

namespace {

struct QuantLayout {
  size_t x_hwc, col, acc, ytile;
  int64_t tile;
};

QuantLayout quant_layout(const DeformConv2dParams& p, const CpuContext& ctx) {
  QuantLayout l;
  // The float forward's tile width, then evened out so that every task gets as many tiles (5 tiles on 2 tasks left
  // one idle for a fifth of the image: 4x256x32x32).
  const int64_t P = std::max<int64_t>(1, p.out_spatial()), tasks = std::max(1, ctx.num_threads);
  const int64_t tile = forward_tile(p, sizeof(uint8_t), ctx);
  const int64_t ntiles = ((P + tile - 1) / tile + tasks - 1) / tasks * tasks;
  l.tile = std::max<int64_t>(1, (P + ntiles - 1) / ntiles);
  l.x_hwc = bytes_of(p.in_channels * p.height * p.width, 1);
  l.col = bytes_of(p.in_channels * p.kernel_size() * l.tile, 1);
  l.acc = bytes_of(p.out_channels * l.tile, sizeof(int32_t));
  l.ytile = bytes_of(p.out_channels * l.tile, 1);
  return l;
}

inline uint8_t saturate_u8(float v) { return static_cast<uint8_t>(std::min(255.f, std::max(0.f, v))); }

// (C, HW) 8-bit -> (HW, C) uint8 for pixels [pb, pe); `flip` maps int8 to uint8 (+128).
DCNKIT_CPU_CLONES void to_channels_last_u8(const uint8_t* __restrict src, uint8_t* __restrict dst, int64_t C,
                                           int64_t HW, int64_t pb, int64_t pe, uint8_t flip) {
  constexpr int64_t kBlock = 64;
  for (int64_t b = pb; b < pe; b += kBlock) {
    const int64_t e = std::min(pe, b + kBlock);
    for (int64_t c = 0; c < C; ++c) {
      const uint8_t* s = src + c * HW;
      for (int64_t q = b; q < e; ++q) dst[q * C + c] = static_cast<uint8_t>(s[q] ^ flip);
    }
  }
}

// One sampling point's n channels: sum_q w_q * (x_q - z) + z on the uint8 grid, rounded half to even and
// saturated (dequantize -> sample -> quantize with the input's own scale, which cancels). A neighbour outside the
// map is not read; a point outside the map samples as 0 (the value z).
__attribute__((always_inline)) inline void blend_quant(uint8_t* __restrict dst, const uint8_t* const x[4],
                                                       const SampleTaps<float>& s, int64_t n, float z) {
  if (s.ok[0] && s.ok[1] && s.ok[2] && s.ok[3]) {
    const float w0 = s.w[0], w1 = s.w[1], w2 = s.w[2], w3 = s.w[3];
    const float base = z * (1.f - (w0 + w1 + w2 + w3));
    const uint8_t *__restrict x0 = x[0], *__restrict x1 = x[1], *__restrict x2 = x[2], *__restrict x3 = x[3];
    for (int64_t c = 0; c < n; ++c) {
      const float v = w0 * float(x0[c]) + w1 * float(x1[c]) + w2 * float(x2[c]) + w3 * float(x3[c]) + base;
      dst[c] = saturate_u8(std::nearbyint(v));
    }
    return;
  }
  for (int64_t c = 0; c < n; ++c) {
    float v = z;
    for (int q = 0; q < 4; ++q)
      if (s.ok[q]) v += s.w[q] * (float(x[q][c]) - z);
    dst[c] = saturate_u8(std::nearbyint(v));
  }
}

DCNKIT_CPU_CLONES void build_columns_u8(const CpuImage<float, uint8_t>& im, int64_t p0, int64_t tn, uint8_t* col,
                                        float z) {
  build_columns_with(im, p0, tn, col,
                     [z](uint8_t* __restrict dst, const uint8_t* const rows[4], const SampleTaps<float>& s,
                         int64_t n) __attribute__((always_inline)) { blend_quant(dst, rows, s, n, z); });
}

// The int32 tile acc (tn x Cout, position-major) requantized into tile (the same layout, the output type's bits):
// vectorised over the channels. [lo, hi]: the output type's range.
DCNKIT_CPU_CLONES void requantize_tile(const int32_t* __restrict acc, int64_t Cout, int64_t tn,
                                       const float* __restrict m, const float* __restrict b, float yz, float lo,
                                       float hi, uint8_t* __restrict tile) {
  for (int64_t t = 0; t < tn; ++t) {
    const int32_t* a = acc + t * Cout;
    uint8_t* o = tile + t * Cout;
    for (int64_t co = 0; co < Cout; ++co) {
      const float v = std::min(hi, std::max(lo, std::nearbyint(float(a[co]) * m[co] + b[co]) + yz));
      o[co] = static_cast<uint8_t>(static_cast<int32_t>(v));  // int8: its two's complement bits
    }
  }
}

// tile (tn x Cout bytes) -> out (Cout rows of stride P), in blocks of positions.
void tile_to_channels_first(const uint8_t* __restrict tile, int64_t Cout, int64_t tn, uint8_t* __restrict out,
                            int64_t P) {
  constexpr int64_t kBlock = 32;
  for (int64_t t0 = 0; t0 < tn; t0 += kBlock) {
    const int64_t t1 = std::min(tn, t0 + kBlock);
    for (int64_t co = 0; co < Cout; ++co) {
      uint8_t* o = out + co * P;
      for (int64_t t = t0; t < t1; ++t) o[t] = tile[t * Cout + co];
    }
  }
}

}  // namespace

void deform_conv2d_quant_requant_table(int64_t out_channels, float x_scale, const float* w_scale, float y_scale,
                                       const float* bias_f32, const int32_t* bias_i32, float* out_mult,
                                       float* out_bias) {
  for (int64_t co = 0; co < out_channels; ++co) {
    const double step = double(x_scale) * double(w_scale[co]);
    out_mult[co] = static_cast<float>(step / y_scale);
    double b = 0;
    if (bias_f32 != nullptr) b = double(bias_f32[co]) / y_scale;
    if (bias_i32 != nullptr) b = double(bias_i32[co]) * step / y_scale;
    out_bias[co] = static_cast<float>(b);
  }
}

size_t deform_conv2d_forward_quant_workspace_cpu(const DeformConv2dParams& p, const CpuContext& ctx) {
  const QuantLayout l = quant_layout(p, ctx);
  return l.x_hwc + static_cast<size_t>(std::max(1, ctx.num_threads)) * (l.col + l.acc + l.ytile);
}

void deform_conv2d_weight_kc_quant_cpu(int64_t out_channels, int64_t in_per_group, int64_t kernel_size,
                                       const int8_t* weight, int8_t* weight_kc) {
  weight_to_kc(in_per_group, kernel_size, weight, weight_kc, 0, out_channels);
}

Status deform_conv2d_forward_quant_cpu(const DeformConv2dParams& p, const DeformConv2dQuant& q, const void* input,
                                       const float* offset, const int8_t* weight_kc, const float* mask, void* output,
                                       void* workspace, const CpuContext& ctx, QGemmFn gemm, void* gemm_self) {
  const int64_t N = p.batch, P = p.out_spatial();
  if (N == 0 || p.out_channels == 0 || P == 0) return Status::Ok();
  if (gemm == nullptr) return Status::Internal("deform_conv2d_forward_quant_cpu: no int8 GEMM");
  const int64_t K = p.kernel_size(), HW = p.height * p.width, Cin = p.in_channels, CK = Cin * K;
  const int64_t Gd = p.attrs.deformable_groups;
  const int64_t G = p.attrs.groups, Cout = p.out_channels, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  const QuantLayout l = quant_layout(p, ctx);
  char* ws = static_cast<char*>(workspace);
  uint8_t* x_hwc = reinterpret_cast<uint8_t*>(ws);
  char* slots = ws + l.x_hwc;
  const uint8_t flip = q.x_signed ? 0x80 : 0;
  const int32_t z = q.x_zero + (q.x_signed ? 128 : 0);  // on the uint8 grid
  constexpr int64_t kPixBlock = 256;
  const int64_t pblocks = (HW + kPixBlock - 1) / kPixBlock;
  const int64_t tile = l.tile, ntiles = (P + tile - 1) / tile;
  const int64_t tasks = std::max<int64_t>(1, std::min<int64_t>(ctx.num_threads, ntiles));
  std::vector<Status> statuses(static_cast<size_t>(tasks));
  const uint8_t* in8 = static_cast<const uint8_t*>(input);
  uint8_t* out8 = static_cast<uint8_t*>(output);  // uint8 or int8 bits
  const float yz = static_cast<float>(q.y_zero);
  for (int64_t n = 0; n < N; ++n) {
    parallel_for(ctx, pblocks, [&](int64_t b, int64_t e) {
      for (int64_t it = b; it < e; ++it) {
        const int64_t pb = it * kPixBlock;
        to_channels_last_u8(in8 + n * Cin * HW, x_hwc, Cin, HW, pb, std::min(HW, pb + kPixBlock), flip);
      }
    });
    const CpuImage<float, uint8_t> im{&p, x_hwc, offset + n * 2 * Gd * K * P, mask ? mask + n * Gd * K * P : nullptr};
    std::atomic<int64_t> next_tile{0};
    parallel_tasks(ctx, tasks, [&](int64_t task) {
      char* slot = slots + static_cast<size_t>(task) * (l.col + l.acc + l.ytile);
      uint8_t* col = reinterpret_cast<uint8_t*>(slot);
      int32_t* acc = reinterpret_cast<int32_t*>(slot + l.col);
      uint8_t* ytile = reinterpret_cast<uint8_t*>(slot + l.col + l.acc);
      for (int64_t it = next_tile.fetch_add(1); it < ntiles; it = next_tile.fetch_add(1)) {
        const int64_t p0 = it * tile, tn = std::min(tile, P - p0);
        build_columns_u8(im, p0, tn, col, static_cast<float>(z));
        for (int64_t g = 0; g < G; ++g) {
          QGemmArgs ga;
          ga.m = tn;
          ga.n = cout_g;
          ga.k = K * cin_g;
          ga.a = col + g * K * cin_g;
          ga.lda = CK;
          ga.a_zero = static_cast<uint8_t>(z);
          ga.b = weight_kc + g * cout_g * K * cin_g;
          ga.ldb = K * cin_g;
          ga.c = acc + g * cout_g;
          ga.ldc = Cout;
          Status s = gemm(gemm_self, ga);
          if (!s.ok()) {
            statuses[static_cast<size_t>(task)] = s;
            return;
          }
        }
        requantize_tile(acc, Cout, tn, q.out_mult, q.out_bias, yz, q.y_signed ? -128.f : 0.f,
                        q.y_signed ? 127.f : 255.f, ytile);
        tile_to_channels_first(ytile, Cout, tn, out8 + n * Cout * P + p0, P);
      }
    });
    DCNKIT_RETURN_IF_ERROR(first_error(statuses));
  }
  return Status::Ok();
}

}  // namespace dcnkit
