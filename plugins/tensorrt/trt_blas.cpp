// The per-execution-context cuBLAS handles of trt_blas.h: a refcounted table under a mutex (TensorRT may
// create and destroy contexts from several threads).
#include "trt_blas.h"

#include <map>
#include <memory>
#include <mutex>

namespace dcnkit::trt {
namespace {

struct Entry {
  CublasGemm gemm;
  int64_t refs = 0;
};

std::mutex& table_mutex() {
  static std::mutex m;
  return m;
}

// Never destroyed: plugin instances may outlive static destruction at process exit.
std::map<const void*, std::unique_ptr<Entry>>& table() {
  static auto* t = new std::map<const void*, std::unique_ptr<Entry>>();
  return *t;
}

}  // namespace

CublasGemm* acquire_context_gemm(const void* key, Status* s) {
  std::lock_guard<std::mutex> lock(table_mutex());
  std::unique_ptr<Entry>& e = table()[key];
  if (e == nullptr) {
    auto fresh = std::make_unique<Entry>();
    *s = cublas_status(cublasCreate(&fresh->gemm.handle), "cublasCreate");
    if (!s->ok()) {
      table().erase(key);
      return nullptr;
    }
    e = std::move(fresh);
  }
  ++e->refs;
  *s = Status::Ok();
  return &e->gemm;
}

void release_context_gemm(const void* key) {
  std::lock_guard<std::mutex> lock(table_mutex());
  auto it = table().find(key);
  if (it == table().end() || --it->second->refs > 0) return;
  cublasDestroy(it->second->gemm.handle);
  table().erase(it);
}

}  // namespace dcnkit::trt
