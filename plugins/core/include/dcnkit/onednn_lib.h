// oneDNN (libdnnl), loaded at first use (dlopen) by the runtime adapters' CPU GEMMs: the packed float32 GEMM
// (cpu_gemm.h; oneDNN 3.x) and the quantized kernels' int8 GEMM (oneDNN 2.x or 3.x). The libraries have no link
// dependency on it: they load, and run every op on OpenBLAS, where it is absent. Where it is looked for, in order:
//   1. $DCNKIT_ONEDNN_LIB (a path to libdnnl.so.*), and nothing else when it is set;
//   2. libdnnl.so.3 beside the calling library, then in the Python environment that holds it (the pip wheel
//      onednn-cpu-gomp installs <prefix>/lib/libdnnl.so.3; the library sits in <prefix>/lib/pythonX.Y/site-packages/
//      dcnkit/lib), then the system's libdnnl.so.3;
//   3. the Debian build that scripts/onednn_fetch.sh unpacks into a source tree's .deps/onednn/lib (builds from a
//      checkout), then the system's libdnnl.so.2.
// Built into those libraries only (plugins/core/src/cpu_gemm/), never into the core.
#pragma once

#include <string>

namespace dcnkit {

struct OneDnnLib {
  void* handle = nullptr;  // null: not found (error says what was tried)
  int major = 0, minor = 0, patch = 0;
  std::string path;   // the file loaded
  std::string tried;  // "\n  <path>: <why not>" per candidate that failed
  // oneDNN's OpenMP runtime (null: another runtime, or none loaded).
  int (*omp_get_max_threads)() = nullptr;
  void (*omp_set_num_threads)(int) = nullptr;

  void* symbol(const char* name) const;
};

// The process's oneDNN (loaded once, thread-safe).
const OneDnnLib& onednn_lib();

// While alive, oneDNN's OpenMP runtime runs on the calling thread alone (team size 1), so that oneDNN calls made from
// ONNX Runtime's or OpenVINO's threads start no OpenMP threads of their own; the thread's setting is restored after.
class OneDnnOnThisThread {
 public:
  OneDnnOnThisThread();
  ~OneDnnOnThisThread();
  OneDnnOnThisThread(const OneDnnOnThisThread&) = delete;
  OneDnnOnThisThread& operator=(const OneDnnOnThisThread&) = delete;

 private:
  int previous_ = 0;
};

}  // namespace dcnkit
