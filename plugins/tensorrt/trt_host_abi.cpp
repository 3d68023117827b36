// Which TensorRT runs in this process, and the calls into its host side through that release's ABI
// (trt_host_abi.h). Needs no TensorRT header: the per-major calls live in trt_abi_shim.cpp's copies.
#include "trt_host_abi.h"

#include <cxxabi.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <typeinfo>

#define DCNKIT_DECLARE_ABI(ns)                                                         \
  namespace dcnkit::trt::ns {                                                          \
  void* find_logger(void* finder);                                                     \
  void log(void* logger, int severity, const char* message);                           \
  bool register_creator(void* registry, void* creator, const char* plugin_namespace);  \
  }
#ifdef DCNKIT_TRT_ABI10
DCNKIT_DECLARE_ABI(abi10)
#endif
#ifdef DCNKIT_TRT_ABI11
DCNKIT_DECLARE_ABI(abi11)
#endif

namespace dcnkit::trt {
namespace {

struct Abi {
  int major;
  void* (*find_logger)(void*);
  void (*log)(void*, int, const char*);
  bool (*register_creator)(void*, void*, const char*);
};

constexpr Abi kAbis[] = {
#ifdef DCNKIT_TRT_ABI10
    {10, &abi10::find_logger, &abi10::log, &abi10::register_creator},
#endif
#ifdef DCNKIT_TRT_ABI11
    {11, &abi11::find_logger, &abi11::log, &abi11::register_creator},
#endif
};

const Abi* abi_of(int major) {
  for (const Abi& a : kAbis) {
    if (a.major == major) return &a;
  }
  return nullptr;
}

// getInferLibVersion(): major * 10000 + minor * 100 + patch from TensorRT 10 on, major * 1000 + minor * 100 + patch
// before (8.6.1 is 8601): both to the former.
int32_t normalised(int32_t v) {
  if (v >= 100000) return v;
  return (v / 1000) * 10000 + ((v / 100) % 10) * 100 + v % 100;
}

using GetVersion = int32_t (*)();

// A loaded libnvinfer.so.N, libnvinfer_lean.so.N or libnvinfer_dispatch.so.N: its version (0 when none is loaded).
int loaded_library_version(dl_phdr_info* info, size_t, void* data) {
  const char* path = info->dlpi_name;
  if (path == nullptr || *path == '\0') return 0;
  const char* base = std::strrchr(path, '/');
  base = base != nullptr ? base + 1 : path;
  for (const char* prefix : {"libnvinfer.so.", "libnvinfer_lean.so.", "libnvinfer_dispatch.so."}) {
    const size_t n = std::strlen(prefix);
    if (std::strncmp(base, prefix, n) != 0 || base[n] < '0' || base[n] > '9') continue;
    int32_t version = static_cast<int32_t>(std::strtol(base + n, nullptr, 10)) * 10000;
    if (void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD)) {
      if (auto get = reinterpret_cast<GetVersion>(dlsym(h, "getInferLibVersion"))) version = normalised(get());
      dlclose(h);
    }
    *static_cast<int32_t*>(data) = version;
    return 1;  // the first one found
  }
  return 0;
}

// The major of the ILoggerFinder `object` derives from, by its run-time type (0 when it has none to read).
int finder_major(const std::type_info* t, int depth = 0) {
  if (t == nullptr || depth > 16) return 0;
  const char* name = t->name();
  name += *name == '*';
  if (std::strcmp(name, "N8nvinfer15v_1_013ILoggerFinderE") == 0) return 11;
  if (std::strcmp(name, "N8nvinfer113ILoggerFinderE") == 0) return 10;
  if (auto si = dynamic_cast<const abi::__si_class_type_info*>(t)) return finder_major(si->__base_type, depth + 1);
  if (auto vmi = dynamic_cast<const abi::__vmi_class_type_info*>(t)) {
    for (unsigned i = 0; i < vmi->__base_count; ++i) {
      if (const int m = finder_major(vmi->__base_info[i].__base_type, depth + 1)) return m;
    }
  }
  return 0;
}

int finder_major(const void* object) {
  if (object == nullptr) return 0;
  // Itanium C++ ABI: the object's first word is its vtable, whose entry -1 is the type_info (0 without RTTI).
  const void* const* vtable = *static_cast<const void* const* const*>(object);
  return finder_major(static_cast<const std::type_info*>(vtable[-1]));
}

std::atomic<int32_t> g_library_version{0};  // a loaded libnvinfer's, once found (a process keeps its TensorRT)

}  // namespace

std::string served_majors_text() {
  std::string s;
  for (size_t i = 0; i < sizeof(kAbis) / sizeof(kAbis[0]); ++i) {
    s += (i == 0 ? "" : i + 1 == sizeof(kAbis) / sizeof(kAbis[0]) ? " and " : ", ") + std::to_string(kAbis[i].major) +
         ".x";
  }
  return s.empty() ? "no TensorRT release" : s;
}

bool serves_major(int major) { return abi_of(major) != nullptr; }

int running_major(const void* finder, int32_t* version) {
  int32_t v = g_library_version.load();
  if (v == 0) {
    dl_iterate_phdr(&loaded_library_version, &v);
    if (v == 0) {
      if (auto get = reinterpret_cast<GetVersion>(dlsym(RTLD_DEFAULT, "getInferLibVersion"))) v = normalised(get());
    }
    if (v != 0) g_library_version.store(v);
  }
  if (v == 0) v = finder_major(finder) * 10000;
  if (version != nullptr) *version = v;
  return v / 10000;
}

std::string release_text(int32_t version) {
  if (version <= 0) return "an unknown TensorRT";
  const int32_t minor = (version / 100) % 100, patch = version % 100;
  if (minor == 0 && patch == 0) return "TensorRT " + std::to_string(version / 10000) + ".x";
  return "TensorRT " + std::to_string(version / 10000) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

void* find_logger(int major, void* finder) {
  const Abi* a = abi_of(major);
  return a != nullptr && finder != nullptr ? a->find_logger(finder) : nullptr;
}

void log_with(int major, void* logger, int severity, const char* message) {
  if (const Abi* a = abi_of(major)) a->log(logger, severity, message);
}

bool register_creator(int major, void* registry, void* creator, const char* plugin_namespace) {
  const Abi* a = abi_of(major);
  return a != nullptr && a->register_creator(registry, creator, plugin_namespace);
}

}  // namespace dcnkit::trt
