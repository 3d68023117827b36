// libdcnkit_trt_autoreg.so: the creators of libdcnkit_trt.so for loaders that only dlopen a plugin library
// and never call getCreators -- Triton's `--backend-config=tensorrt,plugins=`, Polygraphy's --plugins
// (LoadPlugins), LD_PRELOAD into a program linked against libnvinfer (trtexec). When it is loaded into a process
// that already has TensorRT's libnvinfer (10.x or 11.x), it opens libdcnkit_trt.so from its own folder and calls
// that library's explicit dcnkit_trt_register_creators with libnvinfer's plugin registry, handing it libnvinfer's
// global logger first, behind an ILoggerFinder of that release's ABI (trt_abi_shim.cpp). Everything is looked up
// with dlsym: like libdcnkit_trt.so it links nothing from TensorRT. It exports nothing; loading it is the whole
// interface. IPluginRegistry::loadLibrary (trtexec --dynamicPlugins, load_library) takes libdcnkit_trt.so
// itself, never this file: loading both registers every creator twice, and TensorRT refuses the second.
#include <dlfcn.h>

#include <cstdint>
#include <cstdio>
#include <string>

#define DCNKIT_DECLARE_FINDER(ns) \
  namespace dcnkit::trt::ns {     \
  void* nvinfer_logger_finder(void* (*get_logger)()); \
  }
#ifdef DCNKIT_TRT_ABI10
DCNKIT_DECLARE_FINDER(abi10)
#endif
#ifdef DCNKIT_TRT_ABI11
DCNKIT_DECLARE_FINDER(abi11)
#endif

namespace {

constexpr const char* kRegisterCreatorsSymbol = "dcnkit_trt_register_creators";
constexpr const char* kSetLoggerFinderSymbol = "setLoggerFinder";

void warn(const std::string& message) {
  std::fprintf(stderr, "dcnkit: libdcnkit_trt_autoreg.so: %s\n", message.c_str());
}

using GetLogger = void* (*)();

// An ILoggerFinder of `major`'s ABI over libnvinfer's getLogger, or null when this library has no shim for it.
void* logger_finder(int major, GetLogger get_logger) {
#ifdef DCNKIT_TRT_ABI10
  if (major == 10) return dcnkit::trt::abi10::nvinfer_logger_finder(get_logger);
#endif
#ifdef DCNKIT_TRT_ABI11
  if (major == 11) return dcnkit::trt::abi11::nvinfer_logger_finder(get_logger);
#endif
  (void)major;
  (void)get_logger;
  return nullptr;
}

// libdcnkit_trt.so in the folder of this library.
std::string plugin_library_path() {
  Dl_info info{};
  if (dladdr(reinterpret_cast<void*>(&warn), &info) == 0 || info.dli_fname == nullptr) return "libdcnkit_trt.so";
  const std::string self = info.dli_fname;
  const size_t slash = self.rfind('/');
  return (slash == std::string::npos ? std::string() : self.substr(0, slash + 1)) + "libdcnkit_trt.so";
}

__attribute__((constructor)) void register_on_load() {
  void* trt = nullptr;
  std::string nvinfer;
  for (int major : {11, 10}) {  // the releases whose registry ABI the plugin library may serve
    nvinfer = "libnvinfer.so." + std::to_string(major);
    if ((trt = dlopen(nvinfer.c_str(), RTLD_NOW | RTLD_NOLOAD)) != nullptr) break;
  }
  if (trt == nullptr) {
    warn("neither libnvinfer.so.10 nor libnvinfer.so.11 is loaded in this process, so no creator was registered: "
         "load this library after TensorRT (or load libdcnkit_trt.so with IPluginRegistry::loadLibrary instead)");
    return;
  }
  using Version = int32_t (*)();
  using Registry = void* (*)();
  auto version = reinterpret_cast<Version>(dlsym(trt, "getInferLibVersion"));
  auto registry = reinterpret_cast<Registry>(dlsym(trt, "getPluginRegistry"));
  auto get_logger = reinterpret_cast<GetLogger>(dlsym(trt, "getLogger"));
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
  using SetFinder = void (*)(void*);
  using Register = int32_t (*)(void*, int32_t);
  auto set_finder = reinterpret_cast<SetFinder>(dlsym(lib, kSetLoggerFinderSymbol));
  auto register_creators = reinterpret_cast<Register>(dlsym(lib, kRegisterCreatorsSymbol));
  if (set_finder == nullptr || register_creators == nullptr) {
    warn(path + " does not export " + kRegisterCreatorsSymbol + " (another version?)");
    return;
  }
  const int32_t v = version();
  const int major = v >= 100000 ? v / 10000 : v / 1000;
  if (get_logger != nullptr) {
    if (void* finder = logger_finder(major, get_logger)) set_finder(finder);
  }
  register_creators(registry(), v);  // logs what it registered, or why not
}

}  // namespace
