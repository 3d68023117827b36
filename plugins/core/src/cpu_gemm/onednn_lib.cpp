// oneDNN loader (onednn_lib.h).
#include "dcnkit/onednn_lib.h"

#include <dlfcn.h>

#include <cstdlib>
#include <vector>

namespace dcnkit {

namespace {

// dnnl_common.h: const dnnl_version_t* dnnl_version(void), dnnl_version_t = {int major, minor, patch; const char*
// hash; unsigned cpu_runtime, gpu_runtime}: the same in oneDNN 2.x and 3.x.
struct Version {
  int major, minor, patch;
};
using VersionFn = const Version* (*)();

std::string folder_of_this_library() {
  Dl_info info;
  if (dladdr(reinterpret_cast<void*>(&folder_of_this_library), &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string path = info.dli_fname;
  const size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

void* open_lib(const std::string& path, std::string* tried) {
  // Debian's build needs libOpenCL.so.1: a copy beside it (.deps) is loaded first.
  const size_t slash = path.rfind('/');
  if (slash != std::string::npos) {
    const std::string ocl = path.substr(0, slash + 1) + "libOpenCL.so.1";
    if (dlopen(ocl.c_str(), RTLD_NOW | RTLD_GLOBAL | RTLD_NOLOAD) == nullptr) dlopen(ocl.c_str(), RTLD_NOW | RTLD_GLOBAL);
  }
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) {
    const char* e = dlerror();
    *tried += "\n  " + path + ": " + (e ? e : "not loadable");
  }
  return h;
}

std::vector<std::string> candidates() {
  const char* env = std::getenv("DCNKIT_ONEDNN_LIB");
  if (env != nullptr && *env != '\0') return {env};
  std::vector<std::string> c;
  const std::string here = folder_of_this_library();
  if (!here.empty()) {
    c.push_back(here + "/libdnnl.so.3");
    c.push_back(here + "/../../../../libdnnl.so.3");  // <prefix>/lib from <prefix>/lib/pythonX.Y/site-packages/dcnkit/lib
  }
  c.push_back("libdnnl.so.3");
#ifdef DCNKIT_ONEDNN_DEPS_DIR
  c.push_back(std::string(DCNKIT_ONEDNN_DEPS_DIR) + "/libdnnl.so.2");
#endif
  c.push_back("libdnnl.so.2");
  return c;
}

OneDnnLib load() {
  OneDnnLib l;
  for (const std::string& path : candidates()) {
    void* h = open_lib(path, &l.tried);
    if (h == nullptr) continue;
    const auto version = reinterpret_cast<VersionFn>(dlsym(h, "dnnl_version"));
    if (version == nullptr || version() == nullptr) {
      l.tried += "\n  " + path + ": not oneDNN (no dnnl_version)";
      dlclose(h);
      continue;
    }
    l.handle = h;
    l.path = path;
    l.major = version()->major;
    l.minor = version()->minor;
    l.patch = version()->patch;
    l.omp_get_max_threads = reinterpret_cast<int (*)()>(dlsym(h, "omp_get_max_threads"));
    l.omp_set_num_threads = reinterpret_cast<void (*)(int)>(dlsym(h, "omp_set_num_threads"));
    break;
  }
  return l;
}

}  // namespace

void* OneDnnLib::symbol(const char* name) const { return handle ? dlsym(handle, name) : nullptr; }

const OneDnnLib& onednn_lib() {
  static const OneDnnLib l = load();
  return l;
}

OneDnnOnThisThread::OneDnnOnThisThread() {
  const OneDnnLib& l = onednn_lib();
  if (l.omp_get_max_threads == nullptr || l.omp_set_num_threads == nullptr) return;
  previous_ = l.omp_get_max_threads();
  if (previous_ != 1) l.omp_set_num_threads(1);
}

OneDnnOnThisThread::~OneDnnOnThisThread() {
  if (previous_ > 1) onednn_lib().omp_set_num_threads(previous_);
}

}  // namespace dcnkit
