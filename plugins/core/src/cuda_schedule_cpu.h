// DCNKIT_DCN_CPU_PATH=cuda-schedule (read once per process; for tests): the CPU launchers of DCNv3 / DCNv4 and
// multi-scale deformable attention run what their CUDA launchers run instead -- the same launch grid and channel
// runs, the same per-thread functions, serially, the backward's atomic scatters as plain += into zeroed buffers, and
// no host check that the CUDA launchers do not make (MSDA's level tables: a bad table gives zeros, as on CUDA). So
// the CPU tests check the GPU code's math and indexing. DeformConv2d's CPU paths: deform_conv2d_cpu_test_paths.h.
// Internal to plugins/core/src.
#pragma once

#include <cstdlib>
#include <cstring>

namespace dcnkit {

inline bool cuda_schedule_on_cpu() {
  static const bool on = [] {
    const char* e = std::getenv("DCNKIT_DCN_CPU_PATH");
    return e != nullptr && std::strcmp(e, "cuda-schedule") == 0;
  }();
  return on;
}

}  // namespace dcnkit
