// The CUDA-EP scratch source decision (plugins/onnxruntime/ort_scratch_source.h) on the CPU: every combination of C API
// version, headers and memory-pool support, and the test override. Prints "passed N failed M".
#include <cstdio>
#include <initializer_list>

#include "ort_scratch_source.h"

using dcnkit::ort::ScratchSource;
using dcnkit::ort::scratch_source;

static int passed = 0, failed = 0;

static void expect(ScratchSource got, ScratchSource want, const char* what) {
  if (got == want) {
    ++passed;
  } else {
    ++failed;
    std::printf("FAIL %s: got %d, expected %d\n", what, static_cast<int>(got), static_cast<int>(want));
  }
}

int main() {
  const ScratchSource kBuffer = ScratchSource::kOrtScratchBuffer, kPool = ScratchSource::kStreamOrderedPool,
                      kSynced = ScratchSource::kOrtAllocatorSynced;
  // C API 18 and later with headers that declare it: ONNX Runtime's scratch buffer, pools or not.
  for (unsigned api : {18u, 21u, 24u}) {
    expect(scratch_source(api, true, true), kBuffer, "api >= 18, pools");
    expect(scratch_source(api, true, false), kBuffer, "api >= 18, no pools");
    expect(scratch_source(api, false, true), kPool, "headers without GetScratchBuffer, pools");
    expect(scratch_source(api, false, false), kSynced, "headers without GetScratchBuffer, no pools");
  }
  // ONNX Runtime 1.16 / 1.17 (C API 16, 17): cudaMallocAsync only where the device has memory pools.
  for (unsigned api : {16u, 17u}) {
    expect(scratch_source(api, true, true), kPool, "api < 18, pools");
    expect(scratch_source(api, true, false), kSynced, "api < 18, no pools");
  }
  // The override, where the setup allows it; otherwise the decision above.
  expect(scratch_source(21, true, true, "allocator"), kSynced, "forced allocator");
  expect(scratch_source(21, true, true, "pool"), kPool, "forced pool");
  expect(scratch_source(21, true, false, "pool"), kBuffer, "forced pool without pools");
  expect(scratch_source(17, true, true, "scratch-buffer"), kPool, "forced scratch buffer below api 18");
  expect(scratch_source(17, true, false, "scratch-buffer"), kSynced, "forced scratch buffer, api 17, no pools");
  expect(scratch_source(21, true, true, "something"), kBuffer, "unknown override");
  expect(scratch_source(17, true, true, ""), kPool, "empty override");
  std::printf("passed %d failed %d\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
