// libdcnkit_trt_autoreg.so: the creators of libdcnkit_trt.so for loaders that only dlopen a plugin library
// and never call getCreators -- Triton's `--backend-config=tensorrt,plugins=`, Polygraphy's --plugins
// (LoadPlugins), LD_PRELOAD into a program linked against libnvinfer (trtexec). When it is loaded into a process
// that already has TensorRT's libnvinfer of the major version of the headers it was built with, it opens
// libdcnkit_trt.so from its own folder and calls that library's explicit dcnkit_trt_register_creators with
// libnvinfer's plugin registry, handing it libnvinfer's global logger first. Everything is looked up with
// dlsym: like libdcnkit_trt.so it links nothing from TensorRT. It exports nothing; loading it is the whole
// interface. IPluginRegistry::loadLibrary (trtexec --dynamicPlugins, load_library) takes libdcnkit_trt.so
// itself, never this file: loading both registers every creator twice, and TensorRT refuses the second.
#include <dlfcn.h>

#include <cstdio>
#include <string>

#include "trt_entry_points.h"

namespace {

void warn(const std::string& message) {
  std::fprintf(stderr, "dcnkit: libdcnkit_trt_autoreg.so: %s\n", message.c_str());
}

// libnvinfer's global logger (getLogger), for plugin messages outside a builder's or runtime's call.
class NvinferLoggerFinder final : public nvinfer1::ILoggerFinder {
 public:
  using GetLogger = nvinfer1::ILogger* (*)();
  GetLogger get_logger = nullptr;
  nvinfer1::ILogger* findLogger() override { return get_logger != nullptr ? get_logger() : nullptr; }
};

NvinferLoggerFinder g_finder;

// libdcnkit_trt.so in the folder of this library.
std::string plugin_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&warn), &info) == 0 || info.dli_fname == nullptr) return "libdcnkit_trt.so";
  const std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "libdcnkit_trt.so";
}

__attribute__((constructor)) void register_on_load() {
  const std::string nvinfer = "libnvinfer.so." + std::to_string(NV_TENSORRT_MAJOR);
  void* trt = dlopen(nvinfer.c_str(), RTLD_NOW | RTLD_NOLOAD);
  if (trt == nullptr) {
    warn(nvinfer + " is not loaded in this process, so no creator was registered: load this library after "
                   "TensorRT (or load libdcnkit_trt.so with IPluginRegistry::loadLibrary instead)");
    return;
  }
  using Version = int32_t (*)();
  using Registry = nvinfer1::IPluginRegistry* (*)();
  auto version = reinterpret_cast<Version>(dlsym(trt, "getInferLibVersion"));
  auto registry = reinterpret_cast<Registry>(dlsym(trt, "getPluginRegistry"));
  g_finder.get_logger = reinterpret_cast<NvinferLoggerFinder::GetLogger>(dlsym(trt, "getLogger"));
  dlclose(trt);  // balances the RTLD_NOLOAD reference; libnvinfer stays loaded
  if (version == nullptr || registry == nullptr) {
    warn(nvinfer + " has no getInferLibVersion / getPluginRegistry: no creator was registered");
    return;
  }
  const std::string path = plugin_library_path();
  void* lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);  // kept open: the creators live there
  if (lib == nullptr) {
    warn("cannot load the plugin library " + path + ": " + dlerror());
    return;
  }
  using SetFinder = void (*)(nvinfer1::ILoggerFinder*);
  using Register = int32_t (*)(nvinfer1::IPluginRegistry*, int32_t);
  auto set_finder = reinterpret_cast<SetFinder>(dlsym(lib, dcnkit::trt::kSetLoggerFinderSymbol));
  auto register_creators = reinterpret_cast<Register>(dlsym(lib, dcnkit::trt::kRegisterCreatorsSymbol));
  if (set_finder == nullptr || register_creators == nullptr) {
    warn(path + " does not export " + dcnkit::trt::kRegisterCreatorsSymbol + " (another version?)");
    return;
  }
  if (g_finder.get_logger != nullptr) set_finder(&g_finder);
  register_creators(registry(), version());  // logs what it registered, or why not
}

}  // namespace
