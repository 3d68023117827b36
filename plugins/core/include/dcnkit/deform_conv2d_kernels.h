// Per-element math of DeformConv2d / ModulatedDeformConv2d (docs/operators.md), shared by the CPU and CUDA
// launchers. Everything here is DCNKIT_HD: the CPU loops over these functions, the CUDA kernels are
// grid-stride loops over the same functions. Bilinear sampling comes from bilinear.h (dcn_taps).
//
// Layouts (one image n; P = Ho*Wo, K = kh*kw, position pos = ho*Wo + wo):
//   input_n  (Cin, H, W)        offset_n (Gd*2*K, P)      mask_n (Gd*K, P) or null
//   column row r = c*K + k  (c: input channel, k = i*kw + j), i.e. the im2col layout of ATen/mmcv.
// Only fields of DeformConv2dParams are read here (its member functions are host-only).
#pragma once

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/deform_conv2d.h"

namespace dcnkit {

// The four neighbours of one sampling point with the mask folded into the weights: what the
// forward pass and the input-gradient scatter need. Computed once per (deformable group, kernel
// point, position) and reused for every channel of the group.
template <typename Acc>
struct SampleTaps {
  int64_t idx[4];
  Acc w[4];
  bool ok[4];  // as Taps::ok: a neighbour outside the map is never read
};

// Sampling point (py, px) and mask m of (deformable group g, kernel point k = i*kw + j, output position
// pos = ho*Wo + wo); the caller passes i, j, ho, wo (loops know them without dividing).
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_point_at(const DeformConv2dParams& p, const T* offset_n, const T* mask_n,
                                      int64_t g, int64_t k, int64_t i, int64_t j, int64_t ho,
                                      int64_t wo, int64_t pos, Acc* py, Acc* px, Acc* m) {
  const int64_t K = p.kernel_h * p.kernel_w;
  const int64_t P = p.out_h * p.out_w;
  const T* off = offset_n + (g * 2 * K + 2 * k) * P + pos;
  *py = Acc(ho * p.attrs.stride_h - p.attrs.pad_h + i * p.attrs.dilation_h) + to_acc<Acc>(off[0]);
  *px = Acc(wo * p.attrs.stride_w - p.attrs.pad_w + j * p.attrs.dilation_w) + to_acc<Acc>(off[P]);
  *m = mask_n ? to_acc<Acc>(mask_n[(g * K + k) * P + pos]) : Acc(1);
}

// The same from (g, k, pos) alone.
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_point(const DeformConv2dParams& p, const T* offset_n, const T* mask_n,
                                   int64_t g, int64_t k, int64_t pos, Acc* py, Acc* px, Acc* m) {
  const int64_t ho = pos / p.out_w, wo = pos - ho * p.out_w;
  const int64_t i = k / p.kernel_w, j = k - i * p.kernel_w;
  deform_conv2d_point_at<Acc, T>(p, offset_n, mask_n, g, k, i, j, ho, wo, pos, py, px, m);
}

// Taps of a sampling point with the mask folded in.
template <typename Acc>
DCNKIT_HD SampleTaps<Acc> masked_taps(Acc py, Acc px, Acc m, int64_t H, int64_t W) {
  const Taps<Acc> t = dcn_taps<Acc>(py, px, H, W);
  SampleTaps<Acc> s;
  for (int q = 0; q < 4; ++q) {
    s.idx[q] = t.idx[q];
    s.ok[q] = t.ok[q];
    // A point outside the map contributes 0 whatever its mask.
    s.w[q] = t.inside ? t.w[q] * m : Acc(0);
  }
  return s;
}

// Taps of (g, k, pos) with the mask folded in.
template <typename Acc, typename T>
DCNKIT_HD SampleTaps<Acc> deform_conv2d_sample_taps(const DeformConv2dParams& p, const T* offset_n,
                                                    const T* mask_n, int64_t g, int64_t k,
                                                    int64_t pos) {
  Acc py, px, m;
  deform_conv2d_point<Acc, T>(p, offset_n, mask_n, g, k, pos, &py, &px, &m);
  return masked_taps<Acc>(py, px, m, p.height, p.width);
}

// m * S_dcn(img, py, px) from precomputed taps. Pixel idx of the channel is img[idx * pixel_stride]
// (1 for NCHW maps; Cin for a channels-last copy, where img points at the channel). Neighbours outside
// the map are not read.
template <typename Acc, typename T>
DCNKIT_HD Acc sample_value(const T* img, const SampleTaps<Acc>& s, int64_t pixel_stride = 1) {
  Acc v = Acc(0);
  for (int q = 0; q < 4; ++q) {
    if (s.ok[q]) v += s.w[q] * to_acc<Acc>(img[s.idx[q] * pixel_stride]);
  }
  return v;
}

// One column element: row r = c*K + k, position pos (the sampled value times the mask).
template <typename Acc, typename T>
DCNKIT_HD Acc deform_conv2d_column(const DeformConv2dParams& p, const T* input_n, const T* offset_n,
                                   const T* mask_n, int64_t c, int64_t k, int64_t pos) {
  const int64_t g = c / (p.in_channels / p.attrs.deformable_groups);
  const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, offset_n, mask_n, g, k, pos);
  return sample_value<Acc, T>(input_n + c * p.height * p.width, s);
}

// Input-gradient scatter of one column-gradient value v at precomputed taps: grad_img[idx] += w * v.
// `add(G* dst, Acc value)` is a plain += on the CPU and atomicAdd on CUDA; G is the type of the gradient
// buffer the scatter adds into (the storage type, or float32 for 16-bit types on CUDA). Taps of weight 0 are
// skipped (they add nothing; every neighbour outside the map has weight 0).
template <typename Acc, typename G, typename Add>
DCNKIT_HD void sample_scatter(G* grad_img, const SampleTaps<Acc>& s, Acc v, Add add,
                              int64_t pixel_stride = 1) {
  for (int q = 0; q < 4; ++q) {
    if (s.ok[q] && s.w[q] != Acc(0)) add(grad_img + s.idx[q] * pixel_stride, s.w[q] * v);
  }
}

// Input-gradient scatter of one column-gradient element (row c*K + k, position pos) into a gradient
// buffer of type G (see sample_scatter).
template <typename Acc, typename T, typename Add, typename G>
DCNKIT_HD void deform_conv2d_scatter_input(const DeformConv2dParams& p, const T* offset_n,
                                           const T* mask_n, Acc grad_col_value, int64_t c,
                                           int64_t k, int64_t pos, G* grad_input_n, Add add) {
  const int64_t g = c / (p.in_channels / p.attrs.deformable_groups);
  const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, offset_n, mask_n, g, k, pos);
  sample_scatter<Acc, G, Add>(grad_input_n + c * p.height * p.width, s, grad_col_value, add);
}

// Partial sums over the channels c in [0, nc) of gcol(c) * (dS/dy, dS/dx, S) at the (unmasked) taps t,
// with the value of channel c at pixel idx = x[c * x_cs + idx * x_ps] and gcol(c) = gcol[c * g_cs].
// Neighbours outside the map are not read.
template <typename Acc, typename T>
DCNKIT_HD void taps_channel_dots(const Taps<Acc>& t, const T* x, int64_t x_cs, int64_t x_ps,
                                 const T* gcol, int64_t g_cs, int64_t nc, Acc* sy, Acc* sx, Acc* sv) {
  Acc d[4] = {Acc(0), Acc(0), Acc(0), Acc(0)};
  for (int64_t c = 0; c < nc; ++c) {
    const Acc gc = to_acc<Acc>(gcol[c * g_cs]);
    const T* xc = x + c * x_cs;
    for (int q = 0; q < 4; ++q) {
      if (t.ok[q]) d[q] += gc * to_acc<Acc>(xc[t.idx[q] * x_ps]);
    }
  }
  Acc gy = Acc(0), gx = Acc(0), gv = Acc(0);
  for (int q = 0; q < 4; ++q) {
    if (!t.ok[q]) continue;
    gy += t.dwy[q] * d[q];
    gx += t.dwx[q] * d[q];
    gv += t.w[q] * d[q];
  }
  *sy = gy;
  *sx = gx;
  *sv = gv;
}

// Offset and mask gradients of one (deformable group g, kernel point k, position pos), summed over the
// channels of the group: with gcol = d loss / d column[c*K + k, pos],
//   d/d offset_y = m * sum_c gcol * dS/dy,  d/d offset_x = m * sum_c gcol * dS/dx,
//   d/d mask     = sum_c gcol * S.
// input_n is NCHW; grad_col_at points at the column-gradient element of row 0 for this position, row r
// is at grad_col_at[r * ld_col].
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_offset_mask_grad(const DeformConv2dParams& p, const T* input_n,
                                              const T* offset_n, const T* mask_n,
                                              const T* grad_col_at, int64_t ld_col, int64_t g,
                                              int64_t k, int64_t pos, Acc* grad_y, Acc* grad_x,
                                              Acc* grad_m) {
  Acc py, px, m;
  deform_conv2d_point<Acc, T>(p, offset_n, mask_n, g, k, pos, &py, &px, &m);
  const Taps<Acc> t = dcn_taps<Acc>(py, px, p.height, p.width);
  Acc gy = Acc(0), gx = Acc(0), gm = Acc(0);
  if (t.inside) {
    const int64_t K = p.kernel_h * p.kernel_w;
    const int64_t HW = p.height * p.width;
    const int64_t cpg = p.in_channels / p.attrs.deformable_groups;
    taps_channel_dots<Acc, T>(t, input_n + g * cpg * HW, HW, 1, grad_col_at + (g * cpg * K + k) * ld_col,
                              K * ld_col, cpg, &gy, &gx, &gm);
  }
  *grad_y = gy * m;
  *grad_x = gx * m;
  *grad_m = gm;
}

// ---------------------------------------------------------------------------------------------
// The CUDA launchers (deform_conv2d.cu), written once so that the CPU can run them too
// (DCNKIT_DCN_CPU_PATH=cuda-schedule): element functions (the work of one CUDA thread) and the
// schedule (chunks of images, GEMM arguments, zeroing) driven by an executor.
//
// Columns of a chunk of nb images starting at image n0: columns[b][c*K + k][pos] (b in [0, nb)), the
// storage type. Element `idx` of a chunk of rows-per-image `rows` decodes as
//   pos = idx % P,  row = (idx / P) % rows,  b = idx / (P * rows),  image n = n0 + b.

// Pointers of image n.
template <typename T>
struct DcnImage {
  const T* x;       // (Cin, H, W)
  const T* offset;  // (Gd*2*K, P)
  const T* mask;    // (Gd*K, P) or null
};
template <typename T>
DCNKIT_HD DcnImage<T> deform_conv2d_image(const DeformConv2dParams& p, const T* input, const T* offset,
                                          const T* mask, int64_t n) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w, Gd = p.attrs.deformable_groups;
  return {input ? input + n * p.in_channels * p.height * p.width : nullptr, offset + n * 2 * Gd * K * P,
          mask ? mask + n * Gd * K * P : nullptr};
}

struct ChunkIndex {
  int64_t b, row, pos;
};
DCNKIT_HD ChunkIndex chunk_index(int64_t idx, int64_t rows, int64_t P) {
  return {idx / (P * rows), (idx / P) % rows, idx % P};
}

// The K column elements of one (image b of the chunk starting at image n0, input channel c, output
// position pos): rows c*K + k for every kernel point k, written to columns[b][c*K + k][pos]. Element idx of
// (nb, Cin, P) decodes once (pos = idx % P, c = (idx / P) % Cin, b = idx / (P * Cin)), the deformable group
// once, and each kernel point then costs its offset/mask loads, corner weights and 4 reads only: the work
// of one CUDA im2col thread (one thread per column element decoded all of that K times).
template <typename Acc, typename T>
DCNKIT_HD void deform_conv2d_im2col_row(const DeformConv2dParams& p, const T* input, const T* offset,
                                        const T* mask, int64_t n0, int64_t idx, T* columns) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const ChunkIndex e = chunk_index(idx, p.in_channels, P);
  const DcnImage<T> im = deform_conv2d_image(p, input, offset, mask, n0 + e.b);
  const int64_t g = e.row / (p.in_channels / p.attrs.deformable_groups);
  const T* img = im.x + e.row * p.height * p.width;
  T* out = columns + (e.b * p.in_channels + e.row) * K * P + e.pos;
  for (int64_t k = 0; k < K; ++k) {
    const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, im.offset, im.mask, g, k, e.pos);
    out[k * P] = from_acc<T>(sample_value<Acc, T>(img, s));
  }
}

// output[n0 + b][co][pos] = bias[co] for element idx of (nb, Cout, P).
template <typename T>
DCNKIT_HD void deform_conv2d_bias_element(const DeformConv2dParams& p, const T* bias, int64_t n0,
                                          int64_t idx, T* output) {
  const int64_t P = p.out_h * p.out_w;
  output[n0 * p.out_channels * P + idx] = bias[(idx / P) % p.out_channels];
}

// Scatter of the K column-gradient elements of one (image b of the chunk, input channel c, output position
// pos) -- rows c*K + k of grad_columns[b] -- into grad_input (type G, see sample_scatter) through
// add(G* dst, Acc v) (atomicAdd on CUDA). Element idx of (nb, Cin, P) decodes once, as in
// deform_conv2d_im2col_row; each kernel point costs its taps and 4 adds only.
template <typename Acc, typename T, typename Add, typename G>
DCNKIT_HD void deform_conv2d_col2im_row(const DeformConv2dParams& p, const T* offset, const T* mask,
                                        const T* grad_columns, int64_t n0, int64_t idx, G* grad_input,
                                        Add add) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const ChunkIndex e = chunk_index(idx, p.in_channels, P);
  const int64_t n = n0 + e.b;
  const DcnImage<T> im = deform_conv2d_image<T>(p, nullptr, offset, mask, n);
  const int64_t g = e.row / (p.in_channels / p.attrs.deformable_groups);
  G* grad_img = grad_input + (n * p.in_channels + e.row) * p.height * p.width;
  const T* gcol = grad_columns + (e.b * p.in_channels + e.row) * K * P + e.pos;
  for (int64_t k = 0; k < K; ++k) {
    const Acc v = to_acc<Acc>(gcol[k * P]);
    if (v == Acc(0)) continue;
    const SampleTaps<Acc> s = deform_conv2d_sample_taps<Acc, T>(p, im.offset, im.mask, g, k, e.pos);
    sample_scatter<Acc, G, Add>(grad_img, s, v, add);
  }
}

// grad_offset / grad_mask (either may be null) of element idx of (nb, Gd*K, P): rows g*K + k, computed in
// the accumulation type Acc (float for 16-bit T on CUDA) and stored as T.
template <typename T, typename Acc = T>
DCNKIT_HD void deform_conv2d_offset_mask_grad_element(const DeformConv2dParams& p, const T* input,
                                                      const T* offset, const T* mask,
                                                      const T* grad_columns, int64_t n0, int64_t idx,
                                                      T* grad_offset, T* grad_mask) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w, Gd = p.attrs.deformable_groups;
  const ChunkIndex e = chunk_index(idx, Gd * K, P);
  const int64_t n = n0 + e.b, g = e.row / K, k = e.row % K;
  const DcnImage<T> im = deform_conv2d_image(p, input, offset, mask, n);
  const T* gcol_b = grad_columns + e.b * p.in_channels * K * P;
  Acc gy, gx, gm;
  deform_conv2d_offset_mask_grad<Acc, T>(p, im.x, im.offset, im.mask, gcol_b + e.pos, P, g, k, e.pos, &gy,
                                         &gx, &gm);
  if (grad_offset) {
    T* go = grad_offset + n * 2 * Gd * K * P;
    go[(g * 2 * K + 2 * k) * P + e.pos] = from_acc<T>(gy);
    go[(g * 2 * K + 2 * k + 1) * P + e.pos] = from_acc<T>(gx);
  }
  if (grad_mask) grad_mask[n * Gd * K * P + e.row * P + e.pos] = from_acc<T>(gm);
}

// The schedule (host only). An executor `ex` provides, each returning a Status:
//   im2col(n0, nb, columns), bias_fill(n0, nb), col2im(n0, nb, grad_columns),
//   offset_mask_grad(n0, nb, grad_columns)  -- the element functions above over a chunk;
//   bias_grad()                              -- grad_bias[co] = sum over n, pos of grad_output;
//   zero(T* dst, int64_t count), gemm(const GemmArgs&)   -- in stream order;
//   weight_gemm(const GemmArgs&)             -- the grad_weight GEMM (C += A x B^T, summed over images):
//                                               gemm(), or (CUDA, 16-bit types) accumulated in float32.
// `columns` holds chunk * Cin*K*P elements.
template <typename T, typename Exec>
Status deform_conv2d_forward_schedule(const DeformConv2dParams& p, DType dt, int64_t chunk, const T* weight,
                                      bool has_bias, T* output, T* columns, Exec& ex) {
  const int64_t N = p.batch, P = p.out_h * p.out_w;
  if (N == 0 || P == 0 || p.out_channels == 0) return Status::Ok();
  const int64_t K = p.kernel_h * p.kernel_w, Cin = p.in_channels, Cout = p.out_channels;
  const int64_t G = p.attrs.groups, cin_g = Cin / G, cout_g = Cout / G;
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nb = chunk < N - n0 ? chunk : N - n0;
    DCNKIT_RETURN_IF_ERROR(ex.im2col(n0, nb, columns));
    if (has_bias) DCNKIT_RETURN_IF_ERROR(ex.bias_fill(n0, nb));
    for (int64_t gc = 0; gc < G; ++gc) {
      // output[n][gc] (Cout_g x P) (+)= W[gc] (Cout_g x Cin_g*K) x columns[b][gc] (Cin_g*K x P), batched over b.
      GemmArgs ga;
      ga.dtype = dt;
      ga.m = cout_g;
      ga.n = P;
      ga.k = cin_g * K;
      ga.beta = has_bias ? 1.f : 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = columns + gc * cin_g * K * P;
      ga.ldb = P;
      ga.stride_b = Cin * K * P;
      ga.c = output + n0 * Cout * P + gc * cout_g * P;
      ga.ldc = P;
      ga.stride_c = Cout * P;
      ga.batch = nb;
      DCNKIT_RETURN_IF_ERROR(ex.gemm(ga));
    }
  }
  return Status::Ok();
}

// Gradients that are null are not computed; grad_mask is ignored without a mask. Written, not accumulated.
template <typename T, typename Exec>
Status deform_conv2d_backward_schedule(const DeformConv2dParams& p, DType dt, int64_t chunk,
                                       const T* grad_output, const T* weight, bool has_mask, T* grad_input,
                                       T* grad_offset, T* grad_weight, T* grad_bias, T* grad_mask,
                                       T* columns, Exec& ex) {
  const int64_t N = p.batch, P = p.out_h * p.out_w;
  const int64_t K = p.kernel_h * p.kernel_w, Cin = p.in_channels, Cout = p.out_channels;
  const int64_t G = p.attrs.groups, cin_g = Cin / G, cout_g = Cout / G;
  if (!has_mask) grad_mask = nullptr;
  if (grad_input) DCNKIT_RETURN_IF_ERROR(ex.zero(grad_input, N * Cin * p.height * p.width));
  if (grad_weight) DCNKIT_RETURN_IF_ERROR(ex.zero(grad_weight, Cout * cin_g * K));
  if (grad_bias) DCNKIT_RETURN_IF_ERROR(ex.bias_grad());
  const bool need_gcol = grad_input || grad_offset || grad_mask;
  if (N == 0 || P == 0 || (!need_gcol && !grad_weight)) return Status::Ok();
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nb = chunk < N - n0 ? chunk : N - n0;
    if (grad_weight) {
      DCNKIT_RETURN_IF_ERROR(ex.im2col(n0, nb, columns));
      for (int64_t b = 0; b < nb; ++b) {
        // grad_weight[gc] += grad_out[n][gc] (Cout_g x P) x columns[b][gc]^T (P x Cin_g*K), batched over gc.
        GemmArgs ga;
        ga.dtype = dt;
        ga.trans_b = true;
        ga.m = cout_g;
        ga.n = cin_g * K;
        ga.k = P;
        ga.beta = 1.f;
        ga.a = grad_output + (n0 + b) * Cout * P;
        ga.lda = P;
        ga.stride_a = cout_g * P;
        ga.b = columns + b * Cin * K * P;
        ga.ldb = P;
        ga.stride_b = cin_g * K * P;
        ga.c = grad_weight;
        ga.ldc = cin_g * K;
        ga.stride_c = cout_g * cin_g * K;
        ga.batch = G;
        DCNKIT_RETURN_IF_ERROR(ex.weight_gemm(ga));
      }
    }
    if (!need_gcol) continue;
    // The column gradient replaces the columns (stream order: after the grad_weight GEMMs).
    for (int64_t gc = 0; gc < G; ++gc) {
      // grad_columns[b][gc] = W[gc]^T (Cin_g*K x Cout_g) x grad_out[n][gc] (Cout_g x P), batched over b.
      GemmArgs ga;
      ga.dtype = dt;
      ga.trans_a = true;
      ga.m = cin_g * K;
      ga.n = P;
      ga.k = cout_g;
      ga.beta = 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = grad_output + n0 * Cout * P + gc * cout_g * P;
      ga.ldb = P;
      ga.stride_b = Cout * P;
      ga.c = columns + gc * cin_g * K * P;
      ga.ldc = P;
      ga.stride_c = Cin * K * P;
      ga.batch = nb;
      DCNKIT_RETURN_IF_ERROR(ex.gemm(ga));
    }
    if (grad_input) DCNKIT_RETURN_IF_ERROR(ex.col2im(n0, nb, columns));
    if (grad_offset || grad_mask) DCNKIT_RETURN_IF_ERROR(ex.offset_mask_grad(n0, nb, columns));
  }
  return Status::Ok();
}

}  // namespace dcnkit
