// Counting harness of RoIAlign's, DeformRoIPool's and DeformPSRoIPool's CUDA block schedules (issue 25, proxy (a)):
// the per-thread DCNKIT_HD bodies of roi_plan.h and psroi_plan.h
// roi_plan.h run over the launch grid with a counting storage type, whose every read (to_acc) and write
// (from_acc) is one global load or store; a read is a RoI-field load when it lands in the rois buffer. Prints
// the counts per output element and exits 1 when a gate fails:
//   RoI-field loads per output <= 0.1, stores per output == 1, tap loads per output <= 4 * samples per bin
//   (DeformRoIPool: its offset loads, 2 per plan entry, counted with the taps).
// Built and run by tests/test_kernel_counts.py (the system C++ compiler, plugins/core/include only).
#include <cstdio>
#include <vector>

#include "dcnkit/bilinear.h"

namespace {
struct Counted {
  double v;
};
const Counted* g_rois_begin = nullptr;
const Counted* g_rois_end = nullptr;
long g_roi_loads = 0, g_other_loads = 0, g_stores = 0;
}  // namespace

namespace dcnkit {
template <>
double to_acc<double, Counted>(const Counted& x) {
  if (&x >= g_rois_begin && &x < g_rois_end) {
    ++g_roi_loads;
  } else {
    ++g_other_loads;
  }
  return x.v;
}
template <>
Counted from_acc<Counted, double>(double v) {
  ++g_stores;
  return Counted{v};
}
}  // namespace dcnkit

#include "dcnkit/multi_level_roi_align_kernels.h"
#include "dcnkit/psroi_plan.h"
#include "dcnkit/roi_plan.h"
#include "dcnkit/roi_plan_serial.h"

int main() {
  using namespace dcnkit;
  // The RoIAlign benchmark's layout at a smaller size: 7x7 bins, sampling ratio 2, avg and max.
  RoIAlignParams p;
  p.batch = 2;
  p.channels = 64;
  p.height = 32;
  p.width = 32;
  p.num_rois = 24;
  p.attrs.pooled_h = p.attrs.pooled_w = 7;
  p.attrs.sampling_ratio = 2;
  p.attrs.spatial_scale = 0.5;
  p.attrs.aligned = true;
  std::vector<Counted> input(p.batch * p.channels * p.height * p.width, Counted{1.0});
  std::vector<Counted> rois;
  for (int64_t k = 0; k < p.num_rois; ++k) {
    const double x1 = 3.0 * (k % 5), y1 = 2.0 * (k % 7);
    for (double v : {double(k % 2), x1, y1, x1 + 20.0 + k, y1 + 16.0 + 0.5 * k}) rois.push_back(Counted{v});
  }
  g_rois_begin = rois.data();
  g_rois_end = rois.data() + rois.size();
  const int64_t outputs = p.num_rois * p.channels * 49;
  const double samples = 4.0;
  bool ok = true;
  std::printf("| mode | RoI-field loads / output | tap loads / output | stores / output |\n|---|---|---|---|\n");
  for (PoolMode mode : {PoolMode::kAvg, PoolMode::kMax}) {
    p.attrs.mode = mode;
    std::vector<Counted> output(outputs, Counted{0.0});
    g_roi_loads = g_other_loads = g_stores = 0;
    int64_t planned = 0;
    const Status st = roi_block_schedule_serial<double>(
        p, p.height * p.width, [&](int64_t k) { return roi_plan_head<double>(p, rois.data(), k); }, 256,
        [&](const RoIPlanHead<double>& h, int64_t k, int64_t c0, int64_t nc, const RoIPlanEntry<double>* plan,
            int tid) {
          if (plan == nullptr) return;
          planned += tid == 0;
          roi_plan_forward_items<double, Counted>(p, h, plan, input.data(), k, c0, nc, tid, 256, output.data(),
                                                  mode == PoolMode::kMax);
        });
    if (!st.ok()) {
      std::printf("FAIL: %s\n", st.message().c_str());
      ok = false;
    }
    const double roi = double(g_roi_loads) / outputs, taps = double(g_other_loads) / outputs,
                 stores = double(g_stores) / outputs;
    std::printf("| %s | %.4f | %.2f | %.3f |\n", pool_mode_name(mode), roi, taps, stores);
    if (planned != p.num_rois * 2) {
      std::printf("FAIL: %lld of %lld blocks planned\n", (long long)planned, (long long)(p.num_rois * 2));
      ok = false;
    }
    if (!(roi <= 0.1)) {
      std::printf("FAIL: RoI-field loads per output %.4f (expected <= 0.1)\n", roi);
      ok = false;
    }
    if (stores != 1.0) {
      std::printf("FAIL: stores per output %.3f (expected 1)\n", stores);
      ok = false;
    }
    if (!(taps <= 4 * samples)) {
      std::printf("FAIL: tap loads per output %.2f (expected <= %g)\n", taps, 4 * samples);
      ok = false;
    }
  }
  // DeformRoIPool (avg): the same layout, each bin moved by its offsets (plan per (RoI, bin), once per block)
  DeformRoIPoolParams dp;
  dp.batch = p.batch;
  dp.channels = p.channels;
  dp.height = p.height;
  dp.width = p.width;
  dp.num_rois = p.num_rois;
  dp.has_offset = true;
  dp.attrs.pooled_h = dp.attrs.pooled_w = 7;
  dp.attrs.sampling_ratio = 2;
  dp.attrs.spatial_scale = 0.5;
  std::vector<Counted> offset(p.num_rois * 2 * 49);
  for (size_t i = 0; i < offset.size(); ++i) offset[i] = Counted{0.3 * double(int(i % 7) - 3)};
  {
    std::vector<Counted> output(outputs, Counted{0.0});
    g_roi_loads = g_other_loads = g_stores = 0;
    int64_t planned = 0;
    const Status st = roi_block_schedule_serial<double>(
        dp, dp.height * dp.width, [&](int64_t k) { return deform_roi_plan_head<double>(dp, rois.data(), k); }, 256,
        [&](const RoIPlanHead<double>& h, int64_t k, int64_t c0, int64_t nc, const RoIPlanEntry<double>* plan,
            int tid) {
          if (plan == nullptr) return;
          planned += tid == 0;
          roi_plan_forward_items<double, Counted>(dp, h, plan, input.data(), k, c0, nc, tid, 256, output.data(),
                                                  false);
        },
        [&](int64_t k) { return DeformRoIOrigin<Counted>{dp, offset.data(), k}; });
    if (!st.ok()) {
      std::printf("FAIL: deform: %s\n", st.message().c_str());
      ok = false;
    }
    const double roi = double(g_roi_loads) / outputs, taps = double(g_other_loads) / outputs,
                 stores = double(g_stores) / outputs;
    std::printf("| deform avg | %.4f | %.2f | %.3f |\n", roi, taps, stores);
    if (planned != p.num_rois * 2) {
      std::printf("FAIL: deform: %lld of %lld blocks planned\n", (long long)planned, (long long)(p.num_rois * 2));
      ok = false;
    }
    if (!(roi <= 0.1)) {
      std::printf("FAIL: deform: RoI-field loads per output %.4f (expected <= 0.1)\n", roi);
      ok = false;
    }
    if (stores != 1.0) {
      std::printf("FAIL: deform: stores per output %.3f (expected 1)\n", stores);
      ok = false;
    }
    if (!(taps <= 4 * samples + 2 * samples / 32.0)) {
      std::printf("FAIL: deform: tap and offset loads per output %.2f (expected <= %g)\n", taps,
                  4 * samples + 2 * samples / 32.0);
      ok = false;
    }
  }
  // DeformPSRoIPool (R-FCN: 7 x 7 bins of 4 x 4 samples, 2 x 2 groups, one class of trans): output and count
  DeformPSRoIPoolParams pp;
  pp.batch = p.batch;
  pp.attrs.output_dim = 16;
  pp.attrs.group_size = 2;
  pp.channels = pp.attrs.output_dim * 4;
  pp.height = p.height;
  pp.width = p.width;
  pp.num_rois = p.num_rois;
  pp.attrs.output_size = pp.attrs.part_size = 7;
  pp.attrs.sample_per_part = 4;
  pp.attrs.spatial_scale = 0.5;
  pp.attrs.trans_std = 0.1;
  std::vector<Counted> trans(p.num_rois * 2 * 49, Counted{0.5});
  std::vector<Counted> ps_input(pp.batch * pp.channels * pp.height * pp.width, Counted{1.0});
  {
    const int64_t ps_outputs = pp.num_rois * pp.attrs.output_dim * 49;
    std::vector<Counted> output(ps_outputs), count(ps_outputs);
    std::vector<RoIPlanEntry<double>> plan(psroi_plan_entries(pp));
    g_roi_loads = g_other_loads = g_stores = 0;
    for (int64_t k = 0; k < pp.num_rois; ++k) {  // one block per RoI: 16 output channels
      const PSRoIPlanHead<double> h = psroi_plan_head<double>(pp, rois.data(), k);
      for (int tid = 0; tid < 256; ++tid) psroi_plan_fill<double>(pp, h, trans.data(), k, tid, 256, plan.data());
      for (int tid = 0; tid < 256; ++tid) {
        psroi_plan_forward_items<double, Counted>(pp, h, plan.data(), ps_input.data(), k, 0, pp.attrs.output_dim, tid,
                                                  256, output.data(), count.data());
      }
    }
    const double roi = double(g_roi_loads) / ps_outputs, taps = double(g_other_loads) / ps_outputs,
                 stores = double(g_stores) / ps_outputs;
    std::printf("| psroi avg | %.4f | %.2f | %.3f |\n", roi, taps, stores);
    if (!(psroi_plan_fits<float>(pp) && roi <= 0.1)) {  // the float launcher plans this call
      std::printf("FAIL: psroi: RoI-field loads per output %.4f (expected <= 0.1, planned in float)\n", roi);
      ok = false;
    }
    if (stores != 2.0) {
      std::printf("FAIL: psroi: stores per output %.3f (expected 2: the output and its count)\n", stores);
      ok = false;
    }
    // 16 samples of 4 taps, and 2 trans loads per plan entry over 16 output channels
    if (!(taps <= 4 * 16 + 2 * 16 / 16.0)) {
      std::printf("FAIL: psroi: tap and trans loads per output %.2f (expected <= %g)\n", taps, 4 * 16 + 2.0);
      ok = false;
    }
  }
  // MultiLevelRoIAlign with a finest level of 2^31 pixels (too large to plan: the launcher runs only the visit
  // kernel) and RoIs on a small level, whose own heads would be planned: every block must still be served (the visit
  // kernel serves every RoI when no plan kernel runs; roi_visit_head), and every output written. The huge level is
  // never read (no RoI is on it).
  {
    MultiLevelRoIAlignParams mp;
    mp.batch = 1;
    mp.channels = 3;
    mp.num_rois = 4;
    mp.attrs.pooled_h = mp.attrs.pooled_w = 2;
    mp.attrs.sampling_ratio = 2;
    mp.attrs.num_levels = 2;
    mp.attrs.finest_scale = 1;
    mp.attrs.aligned = true;
    mp.heights[0] = 65536;
    mp.widths[0] = 32768;
    mp.heights[1] = mp.widths[1] = 8;
    mp.spatial_scales[0] = 1.0;
    mp.spatial_scales[1] = 0.125;
    std::vector<double> small(3 * 64, 1.0), out(4 * 3 * 4, -1.0), mrois;
    for (int64_t k = 0; k < mp.num_rois; ++k) {
      for (double v : {0.0, 1.0 + k, 2.0, 40.0 + 2 * k, 44.0}) mrois.push_back(v);
    }
    const double* maps[2] = {nullptr, small.data()};
    int64_t served = 0, on_small = 0, planned = 0;
    const Status st = roi_block_schedule_serial<double>(
        mp, multi_level_max_pixels(mp), [&](int64_t k) { return multi_level_plan_head<double>(mp, mrois.data(), k); },
        256, [&](const RoIPlanHead<double>& h, int64_t k, int64_t c0, int64_t nc, const RoIPlanEntry<double>* plan,
                 int tid) {
          served += tid == 0;
          on_small += tid == 0 && h.level == 1 && h.stride != 0;
          planned += tid == 0 && plan != nullptr;  // no plan kernel runs: the visit kernel serves them all
          if (plan != nullptr) {
            roi_plan_forward_items<double, double>(mp, h, plan, maps[h.level], k, c0, nc, tid, 256, out.data(), false);
          } else {
            dcnkit::RoIVisitFrame<double> frame;
            roi_visit_forward_items<double, double>(mp, h, h.H, h.W, maps[h.level], k, c0, nc, tid, 256, out.data(),
                                                    &frame, false);
          }
        });
    bool written = true;
    for (double v : out) written = written && v == 1.0;
    std::printf("| multi-level, finest level 2^31 pixels | %lld of %lld blocks served, outputs %s |\n",
                (long long)served, (long long)mp.num_rois, written ? "written" : "NOT written");
    if (!st.ok() || served != mp.num_rois || on_small != mp.num_rois || planned != 0 || !written) {
      std::printf("FAIL: multi-level: %s, %lld of %lld RoIs on the small level served\n",
                  st.ok() ? "ok" : st.message().c_str(), (long long)on_small, (long long)mp.num_rois);
      ok = false;
    }
  }
  return ok ? 0 : 1;
}
