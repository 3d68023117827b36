// The gradient scatters of the DCNv3 / DCNv4 and multi-scale deformable attention backward kernels, written once
// for the CUDA kernels (AtomicAdd) and their CPU runs over the same launch grid (PlainAdd, one thread: the tests'
// DCNKIT_DCN_CPU_PATH=cuda-schedule). The op-specific point functors (Msda/Dcnv3PointAdd) sit in the op's kernel
// header and add through one of these.
#pragma once

#include "dcnkit/bilinear.h"
#include "dcnkit/common.h"

namespace dcnkit {

struct PlainAdd {
  template <typename Acc>
  DCNKIT_HD void operator()(Acc* dst, Acc v) const {
    *dst += v;
  }
};

#ifdef __CUDACC__
struct AtomicAdd {
  template <typename Acc>
  __device__ __forceinline__ void operator()(Acc* dst, Acc v) const {
    atomicAdd(dst, v);
  }
};
#endif

// The final rounding of a gradient accumulated in the accumulation type (float32 for 16-bit types on CUDA): element
// i of the stored gradient, rounded once (store_acc_kernel's body, cuda_utils.cuh).
template <typename T, typename Acc>
DCNKIT_HD void store_acc(const Acc* acc, int64_t i, T* out) {
  out[i] = from_acc<T>(acc[i]);
}

// base[at] += v: the value gradient of MSDA, the input gradient of DCNv3.
template <typename Acc, typename Add>
struct IndexAdd {
  Acc* base;
  Add add;
  DCNKIT_HD void operator()(int64_t at, Acc v) const { add(base + at, v); }
};

}  // namespace dcnkit
