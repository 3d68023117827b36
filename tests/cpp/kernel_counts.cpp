// Counting harness of the DeformConv2d CUDA kernels (issue 25 item 6: CPU proxies of their speed and memory):
// runs the per-thread DCNKIT_HD bodies of deform_conv2d_gather.h over the CUDA launch grid of the launchers'
// own schedule (deform_conv2d_schedule.h) with counting scalar types -- a storage type whose every load
// (to_acc) is classified by the array it reads and every store (from_acc) counted, an accumulation type
// whose floor() is counted (two per sampling point), an index type whose divisions are counted -- and
// prints per column element: sampling points, offset/mask loads, input loads, stores, index divisions and
// backward atomics, for the forward gather, the fused backward and the deterministic backward (plan, sort, pixel
// gather: no atomics, grad_input equal to the scatter's). It also prints the launchers' workspace against
// torchvision's column buffer and the issue 25 model's times (labelled "model"). Exit status 1 when a gate fails.
//
// Built and run by tests/test_kernel_counts.py: g++ -std=c++17 -I plugins/core/include kernel_counts.cpp.
#include <algorithm>
#include <cmath>
#include <utility>
#include <cstdint>
#include <cstdio>
#include <random>
#include <vector>

namespace counts {

struct Counters {
  double loads_input = 0, loads_offset = 0, loads_mask = 0, loads_gcol = 0, loads_other = 0;
  double stores = 0, floors = 0, divisions = 0, atomics = 0;
};
Counters c;

// Storage type: a double in a struct, so that to_acc / from_acc can be specialised.
struct CT {
  double v;
};

// Accumulation type: double arithmetic, counted floor().
struct CA {
  double v = 0;
  CA() = default;
  CA(double x) : v(x) {}
  operator double() const { return v; }
  CA& operator+=(CA o) { v += o.v; return *this; }
  CA& operator-=(CA o) { v -= o.v; return *this; }
  CA& operator*=(CA o) { v *= o.v; return *this; }
};
inline CA floor(CA a) {
  ++c.floors;
  return CA(std::floor(a.v));
}

// Index type: int64 arithmetic, counted division and modulo.
struct CI {
  int64_t v = 0;
  CI() = default;
  CI(int64_t x) : v(x) {}
  operator int64_t() const { return v; }
  CI& operator++() { ++v; return *this; }
  CI& operator+=(int64_t o) { v += o; return *this; }
};
template <class U> int64_t operator/(CI a, U b) { ++c.divisions; return a.v / static_cast<int64_t>(b); }
template <class U> int64_t operator%(CI a, U b) { ++c.divisions; return a.v % static_cast<int64_t>(b); }
template <class U> int64_t operator/(U a, CI b) { ++c.divisions; return static_cast<int64_t>(a) / b.v; }
template <class U> int64_t operator%(U a, CI b) { ++c.divisions; return static_cast<int64_t>(a) % b.v; }
inline int64_t operator/(CI a, CI b) { ++c.divisions; return a.v / b.v; }
inline int64_t operator%(CI a, CI b) { ++c.divisions; return a.v % b.v; }

// The arrays a load may come from.
struct Range {
  const CT *begin = nullptr, *end = nullptr;
  bool has(const CT* p) const { return p >= begin && p < end; }
};
Range input_r, offset_r, mask_r, gcol_r;

inline void count_load(const CT* p) {
  if (input_r.has(p)) ++c.loads_input;
  else if (offset_r.has(p)) ++c.loads_offset;
  else if (mask_r.has(p)) ++c.loads_mask;
  else if (gcol_r.has(p)) ++c.loads_gcol;
  else ++c.loads_other;
}

}  // namespace counts

#include "dcnkit/bilinear.h"

namespace dcnkit {
template <>
inline counts::CA to_acc<counts::CA, counts::CT>(const counts::CT& v) {
  counts::count_load(&v);
  return counts::CA(v.v);
}
template <>
inline counts::CT from_acc<counts::CT, counts::CA>(counts::CA v) {
  ++counts::c.stores;
  return counts::CT{v.v};
}
}  // namespace dcnkit

#include "dcnkit/deform_conv2d_schedule.h"

using namespace dcnkit;
using counts::CA;
using counts::CI;
using counts::CT;

namespace {

int failures = 0;

void gate(bool ok, const char* what, double value, double limit) {
  std::printf("  gate %-44s %8.4f  (limit %g)  %s\n", what, value, limit, ok ? "ok" : "FAIL");
  if (!ok) ++failures;
}

DeformConv2dParams make_params(int64_t N, int64_t C, int64_t H, int64_t W, int64_t k, int64_t Gd, int64_t pad) {
  DeformConv2dParams p;
  p.batch = N;
  p.in_channels = C;
  p.height = H;
  p.width = W;
  p.out_channels = C;
  p.kernel_h = p.kernel_w = k;
  p.attrs.pad_h = p.attrs.pad_w = pad;
  p.attrs.deformable_groups = Gd;
  p.out_h = deform_conv2d_out_size(H, k, 1, pad, 1);
  p.out_w = deform_conv2d_out_size(W, k, 1, pad, 1);
  p.has_mask = true;
  return p;
}

std::vector<CT> random_array(int64_t n, double lo, double hi, unsigned seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> d(lo, hi);
  std::vector<CT> v(static_cast<size_t>(n));
  for (auto& x : v) x.v = d(g);
  return v;
}

// Runs the forward gather and the fused backward of every tile of the launchers' schedule (float32 sizes)
// with the counting types; offsets in (-0.45, 0.45) and no padding keep every sampling point in the map, so
// floors / 2 is the number of sampling points computed.
void count_shape(int64_t N, int64_t C, int64_t H, int64_t W, int64_t k, int64_t Gd) {
  const DeformConv2dParams p = make_params(N, C, H, W, k, Gd, 0);
  const int64_t K = p.kernel_size(), P = p.out_spatial();
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, DType::kFloat32);
  std::vector<CT> input = random_array(N * C * H * W, -1, 1, 1);
  std::vector<CT> offset = random_array(N * 2 * Gd * K * P, -0.45, 0.45, 2);
  std::vector<CT> mask = random_array(N * Gd * K * P, 0, 1, 3);
  std::vector<CT> cols(deform_conv2d_tile_bytes(p, tl, sizeof(float)) / sizeof(float) + 1);
  std::vector<CT> grad_input(static_cast<size_t>(N * C * H * W)), grad_offset(offset.size()), grad_mask(mask.size());
  counts::input_r = {input.data(), input.data() + input.size()};
  counts::offset_r = {offset.data(), offset.data() + offset.size()};
  counts::mask_r = {mask.data(), mask.data() + mask.size()};
  counts::gcol_r = {cols.data(), cols.data() + cols.size()};
  const double elems = double(N) * C * K * P;

  // The kernel-size variant the launchers dispatch to (3x3, 1x1 or runtime), with the counting index type.
  counts::Counters f, b, d;
  double max_diff = 0;
  Status st = dispatch_dcn_variant(p, true, true, [&](auto, auto kt, auto) {
    constexpr int KH = decltype(kt)::KH, KW = decltype(kt)::KW;
    counts::c = counts::Counters{};
    DCNKIT_RETURN_IF_ERROR(for_each_dcn_tile(p, tl, tl.fwd_slices, [&](const DcnTile& t) {
      for (uint32_t i = 0; i < t.threads; ++i)
        deform_conv2d_gather<CA, CT, CI, KH, KW, true>(p, t, input.data(), offset.data(), mask.data(), i, cols.data());
      return Status::Ok();
    }));
    f = counts::c;
    counts::c = counts::Counters{};
    DCNKIT_RETURN_IF_ERROR(for_each_dcn_tile(p, tl, tl.bwd_slices, [&](const DcnTile& t) {
      std::vector<DcnPointGrad<CA>> part(static_cast<size_t>(t.slices));
      for (uint32_t i0 = 0; i0 < t.threads; i0 += static_cast<uint32_t>(t.slices)) {
        for (uint32_t s = 0; s < t.slices; ++s)
          part[s] = deform_conv2d_sampling_backward<CA, CT, CI, KH, KW, true>(
              p, t, input.data(), offset.data(), mask.data(), cols.data(), i0 + s, true, grad_input.data(),
              [](CT* dst, CA v) { ++counts::c.atomics; dst->v += v.v; });
        deform_conv2d_point_grad_store<CA, CT, CI, KH, KW>(
            p, t, i0, dcn_slice_tree(part.data(), static_cast<int>(t.slices)), grad_offset.data(), grad_mask.data());
      }
      return Status::Ok();
    }));
    b = counts::c;
    // Deterministic mode: offset/mask gradients from the fused kernel without the scatter, grad_input from the
    // plan, the sort and the pixel gather (no atomics); grad_input must equal the scatter's.
    counts::c = counts::Counters{};
    std::vector<CA> det(grad_input.size());
    DCNKIT_RETURN_IF_ERROR(for_each_dcn_tile(p, tl, tl.bwd_slices, [&](const DcnTile& t) {
      std::vector<DcnPointGrad<CA>> part(static_cast<size_t>(t.slices));
      for (uint32_t i0 = 0; i0 < t.threads; i0 += static_cast<uint32_t>(t.slices)) {
        for (uint32_t s = 0; s < t.slices; ++s)
          part[s] = deform_conv2d_sampling_backward<CA, CT, CI, KH, KW, true>(
              p, t, input.data(), offset.data(), mask.data(), cols.data(), i0 + s, true, static_cast<CT*>(nullptr),
              [](CT* dst, CA v) { ++counts::c.atomics; dst->v += v.v; });
      }
      DcnTile plan;
      DcnPixelGrid pg;
      DCNKIT_RETURN_IF_ERROR(make_dcn_tile(p, t.n0, t.nb, t.p0, t.pt, 1, &plan));
      DCNKIT_RETURN_IF_ERROR(make_dcn_pixel_grid(p, plan, &pg));
      std::vector<uint32_t> keys(pg.entries), slots(pg.entries);
      std::vector<CA> weights(pg.entries);
      for (uint32_t i = 0; i < plan.threads; ++i)
        deform_conv2d_plan<CA, CT, CI, KH, KW, true>(p, plan, offset.data(), mask.data(), i, keys.data(), slots.data(),
                                                     weights.data());
      std::vector<std::pair<uint32_t, uint32_t>> kv(pg.entries);
      for (uint32_t e = 0; e < pg.entries; ++e) kv[e] = {keys[e], slots[e]};
      std::sort(kv.begin(), kv.end());
      for (uint32_t e = 0; e < pg.entries; ++e) keys[e] = kv[e].first, slots[e] = kv[e].second;
      for (uint32_t i = 0; i < pg.threads; ++i)
        deform_conv2d_pixel_gather<CA, CT, CA>(p, plan, pg, keys.data(), slots.data(), weights.data(), cols.data(), i,
                                               det.data());
      return Status::Ok();
    }));
    d = counts::c;
    for (size_t i = 0; i < det.size(); ++i) max_diff = std::max(max_diff, std::fabs(det[i].v - grad_input[i].v));
    return Status::Ok();
  });
  if (!st.ok()) {
    std::printf("%s\n", st.message().c_str());
    ++failures;
    return;
  }
  std::printf("\nDCN (N=%lld, C=%lld, %lldx%lld, %lldx%lld kernel, Gd=%lld): %.0f column elements; "
              "tiles of %lld image(s) x "
              "%lld positions; slices fwd %lld, bwd %lld\n",
              (long long)N, (long long)C, (long long)H, (long long)W, (long long)k, (long long)k, (long long)Gd, elems,
              (long long)tl.images, (long long)tl.positions, (long long)tl.fwd_slices, (long long)tl.bwd_slices);
  std::printf("  %-22s %10s %10s %10s %10s %10s %10s %10s\n", "per column element", "points", "off+mask", "input",
              "gcol", "stores", "divisions", "atomics");
  const char* names[3] = {"forward gather", "fused backward", "deterministic bwd"};
  for (int pass = 0; pass < 3; ++pass) {
    const counts::Counters& x = pass == 0 ? f : pass == 1 ? b : d;
    std::printf("  %-22s %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f %10.4f\n", names[pass], x.floors / 2 / elems,
                (x.loads_offset + x.loads_mask) / elems, x.loads_input / elems, x.loads_gcol / elems,
                x.stores / elems, x.divisions / elems, x.atomics / elems);
  }
  gate(f.floors / 2 / elems <= 1.0 / 8, "gather sampling points per element", f.floors / 2 / elems, 1.0 / 8);
  gate((f.loads_offset + f.loads_mask) / elems <= 3.0 / 8, "gather offset/mask loads per element",
       (f.loads_offset + f.loads_mask) / elems, 3.0 / 8);
  gate(f.stores == elems, "gather stores per element (exactly)", f.stores / elems, 1);
  gate(f.loads_other == 0 && f.loads_gcol == 0, "gather loads outside input/offset/mask",
       f.loads_other + f.loads_gcol, 0);
  gate(f.divisions == 0, "gather index divisions per element", f.divisions / elems, 0);
  gate(b.floors / 2 / elems <= 1.0 / 8, "backward sampling points per element", b.floors / 2 / elems, 1.0 / 8);
  gate((b.loads_offset + b.loads_mask) / elems <= 3.0 / 8, "backward offset/mask loads per element",
       (b.loads_offset + b.loads_mask) / elems, 3.0 / 8);
  gate(b.loads_gcol == elems, "backward column-gradient loads per element", b.loads_gcol / elems, 1);
  gate(b.atomics / elems <= 4, "backward atomics per element", b.atomics / elems, 4);
  gate(d.atomics == 0, "deterministic backward atomics per element", d.atomics / elems, 0);
  gate(max_diff <= 1e-12, "deterministic grad_input vs atomic path max |diff|", max_diff, 1e-12);
  gate(b.divisions == 0, "backward index divisions per element", b.divisions / elems, 0);
  // offset/mask gradients written once each: 2 offsets + 1 mask per sampling point
  const double points = double(N) * Gd * K * P;
  gate(b.stores == 3 * points, "backward offset/mask stores per point", b.stores / points, 3);
}

// Issue 37 item 4: a point outside the map issues no atomic (the fused backward used to add 0 four times on the window
// clamped to pixel (0, 0): a hot spot under large offsets or padding) and reads nothing. Offsets in [-4, 4] with
// padding put points across the border and outside: the atomics counted must be 4 per channel of each point inside
// (-1, H) x (-1, W) (dcn_taps, bilinear.h, the S_dcn rule: its 2 x 2 window lies in the map) and none for the others;
// with every point pushed far outside, 0 atomics and 0 loads of the column gradient.
void out_of_map_atomics() {
  const DeformConv2dParams p = make_params(2, 8, 6, 7, 3, 2, 1);
  const int64_t K = p.kernel_size(), P = p.out_spatial(), Gd = p.attrs.deformable_groups, N = p.batch;
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, DType::kFloat32);
  std::vector<CT> input = random_array(N * p.in_channels * p.height * p.width, -1, 1, 4);
  std::vector<CT> mask = random_array(N * Gd * K * P, 0, 1, 6);
  std::vector<CT> cols(deform_conv2d_tile_bytes(p, tl, sizeof(float)) / sizeof(float) + 1, CT{1.0});
  std::vector<CT> grad_input(input.size());
  for (double spread : {4.0, 100.0}) {
    std::vector<CT> offset = random_array(N * 2 * Gd * K * P, spread == 4.0 ? -4 : 100, spread, 5);
    double expected = 0, outside = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t g = 0; g < Gd; ++g)
        for (int64_t k = 0; k < K; ++k)
          for (int64_t pos = 0; pos < P; ++pos) {
            const int64_t row = (n * Gd + g) * 2 * K + 2 * k;
            const double py = double(pos / p.out_w - 1 + k / 3) + offset[row * P + pos].v;
            const double px = double(pos % p.out_w - 1 + k % 3) + offset[(row + 1) * P + pos].v;
            const bool inside = dcn_taps(py, px, p.height, p.width).inside;
            expected += inside ? 4.0 * double(p.in_channels / Gd) : 0.0;
            outside += inside ? 0.0 : 1.0;
          }
    counts::c = counts::Counters{};
    counts::input_r = {input.data(), input.data() + input.size()};
    counts::offset_r = {offset.data(), offset.data() + offset.size()};
    counts::mask_r = {mask.data(), mask.data() + mask.size()};
    counts::gcol_r = {cols.data(), cols.data() + cols.size()};
    const Status st = for_each_dcn_tile(p, tl, tl.bwd_slices, [&](const DcnTile& t) {
      for (uint32_t i = 0; i < t.threads; ++i)
        deform_conv2d_sampling_backward<CA, CT, int32_t, 3, 3, true>(
            p, t, input.data(), offset.data(), mask.data(), cols.data(), i, true, grad_input.data(),
            [](CT* dst, CA v) { ++counts::c.atomics; dst->v += v.v; });
      return Status::Ok();
    });
    std::printf("\nfused backward, offsets in [%g, %g]: %.0f points outside the map; %.0f atomics, %.0f expected; %.0f "
                "column-gradient loads\n", spread == 4.0 ? -4.0 : 100.0, spread, outside, counts::c.atomics, expected,
                counts::c.loads_gcol);
    if (spread == 4.0) {
      gate(st.ok() && outside > 0 && counts::c.atomics == expected && counts::c.loads_gcol == expected / 4,
           "atomics: 4 per point inside, 0 outside", counts::c.atomics, expected);
    } else {
      gate(st.ok() && counts::c.atomics == 0 && counts::c.loads_gcol == 0, "atomics and loads of points outside",
           counts::c.atomics + counts::c.loads_gcol, 0);
    }
  }
}

// Issue 37 item 2: CUDA's launch limits (launch_limits.h) and the launches of the DCN schedule at a size that broke
// them: fp32 with bias, C = 64, a 1x1 kernel on 1x1 maps, N = 70,000 (the tile held 65,536 images: the bias kernel's
// gridDim.z and the GEMMs' batch count).
void launch_limits() {
  std::printf("\nlaunch limits\n");
  LaunchDims d;
  d.kernel = "k";
  d.grid[2] = 65536;
  const bool z = !check_launch(d).ok();
  d.grid[2] = 65535;
  const bool z_ok = check_launch(d).ok();
  d.block = 1025;
  const bool block = !check_launch(d).ok();
  d.block = 256;
  d.smem = 48 * 1024 + 1;
  const bool smem = !check_launch(d).ok();
  d.smem_opt_in = true;
  const bool opt_in = check_launch(d).ok();
  gate(z && z_ok && block && smem && opt_in, "check_launch refuses z > 65535, 1025 threads, 48 KiB + 1", 0, 0);
  const DeformConv2dParams p = make_params(70000, 64, 1, 1, 1, 1, 0);
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, DType::kFloat32);
  const Status fwd = check_deform_conv2d_cuda_launches<float>(p, DType::kFloat32, true, true, false, false);
  std::vector<float> g(1);
  const Status bwd = check_deform_conv2d_cuda_launches<float>(p, DType::kFloat32, true, true, true, false, g.data(),
                                                              g.data(), g.data(), g.data(), g.data());
  std::printf("  N=70000, C=64, 1x1 maps and kernel: %lld images per tile; forward %s; backward %s.\n",
              (long long)tl.images, fwd.ok() ? "ok" : fwd.message().c_str(), bwd.ok() ? "ok" : bwd.message().c_str());
  gate(tl.images <= kCudaMaxGridYZ && fwd.ok() && bwd.ok(), "DCN launches at N=70000 within CUDA's limits",
       double(tl.images), double(kCudaMaxGridYZ));
  // A batch of 70,000 GEMMs runs as 65,535 + 4,465, each moved by its strides.
  GemmArgs ga;
  ga.batch = 70000;
  ga.stride_a = 3;
  ga.stride_b = 5;
  ga.stride_c = 7;
  std::vector<std::pair<int64_t, int64_t>> calls;
  const Status st = gemm_in_batches(ga, [&](const GemmArgs& x) {
    calls.push_back({x.batch, static_cast<const char*>(x.c) - static_cast<const char*>(ga.c)});
    return Status::Ok();
  });
  gate(st.ok() && calls.size() == 2 && calls[0].first == 65535 && calls[1].first == 4465 &&
           calls[1].second == int64_t(65535) * 7 * 4,
       "GEMM batches of 70000 split at 65535", double(calls.size()), 2);
}

// Issue 37 item 3: the backward's workspace holds the deterministic plan only in deterministic mode. With deformable
// groups = channels the plan of a tile is about 40x its columns (640 MB in fp16 at full tiles).
void workspace_plan(DType dt) {
  const DeformConv2dParams p = make_params(8, 64, 64, 64, 3, 64, 1);
  const double mib = 1 << 20;
  const double plain = deform_conv2d_cuda_workspace_bytes(p, dt, true, false) / mib;
  const double det = deform_conv2d_cuda_workspace_bytes(p, dt, true, true) / mib;
  const double plan = deform_conv2d_plan_bytes(p, deform_conv2d_cuda_tiling(p, dt), dt) / mib;
  std::printf("\nbackward workspace (8,64,64,64), deformable groups 64, %s: %.1f MiB, deterministic %.1f MiB "
              "(plan %.1f MiB)\n", dtype_name(dt), plain, det, plan);
  gate(det - plain == plan && plain < plan, "plan MiB only in deterministic mode", plain, plan);
}

// Largest divisor of n that is at most 32 (torchvision's n_parallel_imgs).
int64_t torchvision_images(int64_t n) {
  for (int64_t d = std::min<int64_t>(32, n); d > 1; --d)
    if (n % d == 0) return d;
  return 1;
}

void memory(int64_t N, int64_t C, int64_t H, DType dt) {
  const DeformConv2dParams p = make_params(N, C, H, H, 3, 1, 1);
  const double mib = 1 << 20;
  const double fwd = deform_conv2d_cuda_workspace_bytes(p, dt, false) / mib;
  const double bwd = deform_conv2d_cuda_workspace_bytes(p, dt, true) / mib;
  const double tv = double(C) * 9 * torchvision_images(N) * p.out_spatial() * dtype_size(dt) / mib;
  std::printf("\nworkspace (%lld,%lld,%lld,%lld) %s: forward %.1f MiB, backward %.1f MiB (plus CUB's sort scratch); "
              "torchvision's column buffer %.1f MiB\n",
              (long long)N, (long long)C, (long long)H, (long long)H, dtype_name(dt), fwd, bwd, tv);
  if (dt == DType::kFloat32 && N == 8 && C == 64 && H == 64)
    gate(fwd + bwd <= 0.5 * tv, "extra fwd+bwd MiB vs 0.5x torchvision columns", fwd + bwd, 0.5 * tv);
}

// The issue 25 model (H100 SXM, fp32, TF32 off): a kernel takes max(issue time, DRAM time), the issue time at
// R = 7.9e11 warp-instructions/s (fitted on torchvision's im2col, 0.17 ms at (8,32,128,128) measured on an H100 on
// 2026-11-24), the instructions per column element of the gather kernel's sm_90 SASS (scripts/kernel_report.py,
// float, int32 indices, 3x3, mask, 2026-11-25: 69 per 4 channels + 235 once per slice, an upper bound of the
// executed path); DRAM at 3.0 TB/s; GEMM at 50 TFLOP/s. Not a measurement.
void model(int64_t N, int64_t C, int64_t H) {
  const DeformConv2dParams p = make_params(N, C, H, H, 3, 1, 1);
  const DcnTiling tl = deform_conv2d_cuda_tiling(p, DType::kFloat32);
  const double K = 9, P = double(p.out_spatial()), E = N * C * K * P;
  const double slice = double((C + tl.fwd_slices - 1) / tl.fwd_slices);
  const double instr = 69.0 / 4 + 235.0 / slice;
  const double t_issue = E / 32 * instr / 7.9e11;
  const double bytes = 4.0 * (N * C * H * H + 3 * N * K * P + N * C * P);  // input, offset+mask, Y (tiles in L2)
  const double t_dram = bytes / 3.0e12;
  const double t_gemm = 2.0 * C * C * K * P * N / 50e12;
  const double t = std::max(t_issue, t_dram) + t_gemm;
  std::printf("  model (%lld,%lld,%lld,%lld) fp32 forward: gather %.3f ms (%.1f SASS/elem, slice %g), GEMM %.3f ms, "
              "total %.3f ms\n",
              (long long)N, (long long)C, (long long)H, (long long)H, std::max(t_issue, t_dram) * 1e3,
              instr, slice, t_gemm * 1e3, t * 1e3);
}

bool fast_divmod_ok() {
  std::mt19937 g(7);
  for (uint32_t d : {1u, 2u, 3u, 7u, 9u, 10u, 31u, 1000u, 65537u, 123456789u, 2147483647u, 2147483648u}) {
    for (int i = 0; i < 20000; ++i) {
      const uint32_t x = i < 3 ? uint32_t(i) * (d - 1 > 0 ? d - 1 : 1) % 2147483648u : g() % 2147483648u;
      const FastDivmod f(d);
      uint32_t q, r;
      f.divmod(x, q, r);
      if (q != x / d || r != x % d) {
        std::printf("FastDivmod(%u): %u -> %u, %u\n", d, x, q, r);
        return false;
      }
    }
  }
  return true;
}

}  // namespace

int main() {
  gate(fast_divmod_ok(), "FastDivmod exact (0 mismatches)", 0, 0);
  count_shape(2, 64, 16, 16, 3, 1);
  count_shape(2, 32, 20, 20, 3, 2);
  count_shape(1, 16, 12, 12, 1, 1);
  count_shape(1, 16, 12, 12, 5, 1);
  memory(8, 64, 64, DType::kFloat32);
  memory(8, 64, 64, DType::kFloat16);
  workspace_plan(DType::kFloat32);
  workspace_plan(DType::kFloat16);
  out_of_map_atomics();
  launch_limits();
  std::printf("\nmodel (issue 25's GPU model; predictions, not measurements):\n");
  model(1, 64, 64);
  model(4, 256, 32);
  model(8, 32, 128);
  std::printf("\n%s\n", failures ? "FAILED" : "all gates passed");
  return failures ? 1 : 0;
}
