// Per-element math of the RoI operators (RoIAlign, DeformRoIPool; DeformPSRoIPool in psroi_kernels.h), written once
// as DCNKIT_HD templates and called by the CPU launchers (loops) and the CUDA launchers (grid-stride
// kernels). T is the storage type, Acc the accumulation type. Sampling goes through bilinear.h
// (roi_taps / psroi_taps); nothing here interpolates by itself. See docs/operators.md for the contract.
//
// Every function only reads the four taps of a sample when the sample is inside the map, so a map with
// H == 0 or W == 0 is never read. Non-finite box coordinates or offsets give sampling points that are
// NaN or infinite: those sample as outside (0, or skipped), and an adaptive grid of a non-finite box
// is empty. The work per output element is bounded whatever the box ("Bounded sampling grids" below).
#pragma once

#include <cmath>
#include <limits>
#include <type_traits>

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"
#include "dcnkit/deform_psroi_pool.h"
#include "dcnkit/deform_roi_pool.h"
#include "dcnkit/device_math.h"
#include "dcnkit/roi_align.h"
#if defined(__CUDACC__)
#include "dcnkit/cuda_utils.cuh"
#endif

namespace dcnkit {

// ---------------------------------------------------------------------------------------------
// Checks shared by the RoIAlign-style ops (host): input (N, C, H, W), rois (K, 5), output size
// (oh, ow) >= 1, spatial_scale finite and > 0.
inline Status check_roi_pool_args(const char* op, const Shape& input, const Shape& rois, int64_t pooled_h,
                                  int64_t pooled_w, double spatial_scale) {
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "input", input, 4, "(N, C, H, W)"));
  DCNKIT_RETURN_IF_ERROR(check_rank(op, "rois", rois, 2, "(K, 5)"));
  DCNKIT_RETURN_IF_ERROR(check_dim(op, "rois", rois, 1, 5, "[batch_index, x1, y1, x2, y2]"));
  if (pooled_h < 1 || pooled_w < 1) {
    return arg_error(op, "output_size", "(oh, ow) >= 1",
                     "(" + std::to_string(pooled_h) + ", " + std::to_string(pooled_w) + ")");
  }
  if (!(std::isfinite(spatial_scale) && spatial_scale > 0)) {
    return arg_error(op, "spatial_scale", "a finite value > 0", to_str(spatial_scale));
  }
  return Status::Ok();
}

// An explicit sampling grid (`arg`: sampling_ratio or sample_per_part) is at most kMaxSamplingRatio per
// axis; `lo` is the smallest value allowed (sampling_ratio: any, <= 0 is adaptive; sample_per_part: 1).
inline Status check_sampling_ratio(const char* op, const char* arg, int64_t value, int64_t lo) {
  const std::string limit = std::to_string(kMaxSamplingRatio);
  if (value > kMaxSamplingRatio) {
    return arg_error(op, arg,
                     lo <= 0 ? "a value <= " + limit + " (<= 0: adaptive; the limit of an explicit grid)"
                             : "a value in [" + std::to_string(lo) + ", " + limit + "]",
                     std::to_string(value));
  }
  if (value < lo) return arg_error(op, arg, "a value >= " + std::to_string(lo), std::to_string(value));
  return Status::Ok();
}

// ---------------------------------------------------------------------------------------------
// RoI rows

// Batch index of the RoI row `roi` ([batch_index, x1, y1, x2, y2]); false when it is outside
// [0, batch) or NaN.
template <typename Acc, typename T>
DCNKIT_HD bool roi_batch_index(const T* roi, int64_t batch, int64_t* b) {
  const Acc v = to_acc<Acc>(roi[0]);
  if (!(v >= Acc(0) && v < index_to_acc<Acc>(batch))) return false;
  *b = v < Acc(2147483648.0) ? static_cast<int32_t>(v) : acc_to_index(std::floor(v));
  return true;
}

// Host check of every RoI's batch index (CPU launchers call it before any read); rows of `row` values.
template <typename T>
inline Status check_roi_batch_indices(const char* op, const T* rois, int64_t num_rois,
                                      int64_t batch, int64_t row = 5) {
  for (int64_t k = 0; k < num_rois; ++k) {
    int64_t b = 0;
    if (!roi_batch_index<double>(rois + k * row, batch, &b)) {
      return arg_error(op, "rois[" + std::to_string(k) + ", 0] (batch index)",
                       "a value in [0, " + std::to_string(batch) + ") (the batch size of input)",
                       to_str(static_cast<double>(rois[k * row])));
    }
  }
  return Status::Ok();
}

// The message of a batch index that a CUDA kernel found out of range.
inline std::string roi_batch_device_message(const char* op, int64_t batch) {
  return std::string(op) + ": rois[:, 0] (batch index): expected values in [0, " +
         std::to_string(batch) + ") (the batch size of input), got a value outside that range or NaN";
}

// Samples per bin and axis at the most: an adaptive grid of a box of more than 2^31 - 1 feature pixels per bin keeps
// 2^31 - 1 samples spread over the bin (torchvision's and mmcv's grid size is an int), so that a sample's index is
// 32-bit everywhere.
constexpr int32_t kMaxGridSamples = 0x7fffffff;

// Samples per bin along one axis: the fixed ratio (at most kMaxSamplingRatio), or ceil(extent / pooled) (adaptive),
// at most kMaxGridSamples. An adaptive grid of a non-positive or non-finite extent (ceil of 2^62 or more) is empty.
template <typename Acc>
DCNKIT_HD int32_t roi_grid_size(Acc extent, int64_t pooled, int64_t sampling_ratio) {
  if (sampling_ratio > 0) return static_cast<int32_t>(sampling_ratio);
  const Acc g = std::ceil(div_count(extent, index_to_acc<Acc>(pooled)));
  if (!(g > Acc(0) && g < Acc(4611686018427387904.0))) return 0;
  return g < Acc(2147483647.0) ? static_cast<int32_t>(g) : kMaxGridSamples;
}

// ---------------------------------------------------------------------------------------------
// RoIAlign / DeformRoIPool: a box and its bins

template <typename Acc>
struct RoIAlignBox {
  Acc y_start, x_start;  // top-left corner in feature coordinates
  Acc roi_h, roi_w;
  Acc bin_h, bin_w;
  int32_t gh, gw;        // samples per bin (0: empty grid; at most kMaxGridSamples)
};

// Writes box b to *d (d possibly volatile: a RoIThreadSlot).
template <typename D, typename Acc>
DCNKIT_HD void roi_box_store(D* d, const RoIAlignBox<Acc>& b) {
  d->y_start = b.y_start;
  d->x_start = b.x_start;
  d->roi_h = b.roi_h;
  d->roi_w = b.roi_w;
  d->bin_h = b.bin_h;
  d->bin_w = b.bin_w;
  d->gh = b.gh;
  d->gw = b.gw;
}

// Where a loop keeps what it reads but does not change (p): on the device this thread's slot of a block-wide array in
// shared memory (kernels of 256 threads), read through volatile at each use -- held in registers across a sampling
// loop such values take a kernel past 48; on the host a local.
template <typename S>
struct RoIThreadSlot {
#if defined(__CUDA_ARCH__)
  volatile S* p;
  __device__ RoIThreadSlot() {
    __shared__ S slots[256];
    p = slots + threadIdx.x;
  }
#else
  S local;
  S* p = &local;
  RoIThreadSlot() = default;
  RoIThreadSlot(const RoIThreadSlot&) = delete;
#endif
};

// Geometry of one RoI row: x_start = x1 * s - o, roi_w = x2 * s - o - x_start (o = 0.5 when aligned;
// when not aligned roi_w >= 1), bin = roi / pooled, grid from the sampling ratio.
template <typename Acc, typename T>
DCNKIT_HD RoIAlignBox<Acc> roi_align_box(const T* roi, Acc scale, bool aligned, int64_t pooled_h,
                                         int64_t pooled_w, int64_t sampling_ratio) {
  const Acc o = aligned ? Acc(0.5) : Acc(0);
  RoIAlignBox<Acc> b;
  b.x_start = to_acc<Acc>(roi[1]) * scale - o;
  b.y_start = to_acc<Acc>(roi[2]) * scale - o;
  b.roi_w = (to_acc<Acc>(roi[3]) * scale - o) - b.x_start;
  b.roi_h = (to_acc<Acc>(roi[4]) * scale - o) - b.y_start;
  if (!aligned) {
    if (b.roi_w < Acc(1)) b.roi_w = Acc(1);
    if (b.roi_h < Acc(1)) b.roi_h = Acc(1);
  }
  b.bin_h = div_count(b.roi_h, index_to_acc<Acc>(pooled_h));
  b.bin_w = div_count(b.roi_w, index_to_acc<Acc>(pooled_w));
  b.gh = roi_grid_size(b.roi_h, pooled_h, sampling_ratio);
  b.gw = roi_grid_size(b.roi_w, pooled_w, sampling_ratio);
  return b;
}

// Top-left corner (y0, x0) of bin (ph, pw); DeformRoIPool shifts the box start by
// gamma * roi_w * offset[0] in x and gamma * roi_h * offset[1] in y, where offset_x / offset_y are
// that bin's entries of offset[k, 0] and offset[k, 1] (null: no offset).
// Box: a RoIAlignBox<Acc>, possibly volatile (a block's head read from shared memory at each use).
template <typename Acc, typename T, typename I, typename Box>
DCNKIT_HD void roi_bin_origin(const Box& b, I ph, I pw, const T* offset_x, const T* offset_y, Acc gamma, Acc* y0,
                              Acc* x0) {
  Acc ys = b.y_start, xs = b.x_start;
  if (offset_x != nullptr) {
    xs += gamma * b.roi_w * to_acc<Acc>(*offset_x);
    ys += gamma * b.roi_h * to_acc<Acc>(*offset_y);
  }
  *y0 = ys + index_to_acc<Acc>(ph) * b.bin_h;
  *x0 = xs + index_to_acc<Acc>(pw) * b.bin_w;
}

}  // namespace dcnkit

#include "dcnkit/roi_bin_visit.h"

namespace dcnkit {

// DeformRoIPool: the box of an aligned RoIAlign, bins shifted by the offsets of RoI k (null: none).
template <typename Acc, typename T>
DCNKIT_HD RoIAlignBox<Acc> deform_roi_pool_box(const DeformRoIPoolParams& p, const T* roi) {
  return roi_align_box<Acc>(roi, static_cast<Acc>(p.attrs.spatial_scale), true, p.attrs.pooled_h,
                            p.attrs.pooled_w, p.attrs.sampling_ratio);
}
template <typename Acc, typename T, typename I, typename Box>
DCNKIT_HD void deform_roi_pool_origin(const DeformRoIPoolParams& p, const Box& box, const T* offset, int64_t k, I ph,
                                      I pw, Acc* y0, Acc* x0) {
  const int64_t oh = p.attrs.pooled_h, ow = p.attrs.pooled_w;
  const T* ox = offset ? offset + (k * 2 * oh + ph) * ow + pw : nullptr;
  const T* oy = offset ? ox + oh * ow : nullptr;
  roi_bin_origin<Acc, T>(box, ph, pw, ox, oy, static_cast<Acc>(p.attrs.gamma), y0, x0);
}

// ---------------------------------------------------------------------------------------------
// CUDA helpers of the RoI launchers (nvcc only)

// Element i of a (K, C, oh, ow) tensor (outputs of the RoI ops; C is output_dim for DeformPSRoIPool).
struct RoIElement {
  int64_t k, c, ph, pw;
};
DCNKIT_HD RoIElement roi_element(int64_t i, int64_t C, int64_t oh, int64_t ow) {
  return {i / (ow * oh * C), (i / (ow * oh)) % C, (i / ow) % oh, i % ow};
}

#if defined(__CUDACC__)
// The CUDA launchers never synchronise and never read device data on the host: a RoI whose batch index is
// outside [0, N) or NaN (roi_batch_index false) gives zeros on the device (forward writes 0, backward
// skips it), never an out-of-bounds read. A front end may report it asynchronously (the torch ops run a
// device-side assert with roi_batch_device_message).

// Scatter functor of the backward functions: atomicAdd into `base`, a buffer of the accumulation type
// (the gradient itself for float and double, its float32 accumulator for 16-bit types; see GradAcc).
template <typename Acc>
struct RoIAtomicAdd {
  Acc* base;
  __device__ __forceinline__ void operator()(int64_t i, Acc v) const { atomicAdd(base + i, v); }
};

// This thread's frame of the bounded visit (roi_bin_visit.h): its slot of a block-wide array in shared memory,
// 256 threads.
template <typename Acc>
__device__ __forceinline__ RoIFrameRef<Acc> roi_thread_frame() {
  __shared__ RoIVisitFrame<Acc> frames[kCudaThreads];
  return frames + threadIdx.x;
}

}  // namespace dcnkit
// glibc's assert handler, which CUDA implements on the device (declared here: <assert.h> does not under NDEBUG).
extern "C" __host__ __device__ void __assert_fail(const char*, const char*, unsigned int, const char*) noexcept;
namespace dcnkit {

// The device-side assert of a RoI whose batch index is outside [0, N) or NaN, raised where the params ask for
// it (RoIAlignParams::assert_batch_index: the torch ops). It holds under NDEBUG too (as torch's kernel asserts).
__device__ __noinline__ inline void roi_batch_index_assert_fail() {
  __assert_fail("rois[:, 0] (batch index): expected values in [0, N) (the batch size of input)", __FILE__,
                __LINE__, "roi batch index");
}
#endif

}  // namespace dcnkit
