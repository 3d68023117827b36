// A stand-in for TensorRT's libnvinfer (built with its soname) for the registration tests: it exports what the
// plugin libraries look up (getInferLibVersion, getPluginRegistry, getLogger) and a registry that records what
// is registered. Its loadLibrary does what TensorRT's does -- dlopen, setLoggerFinder, getCreators, then
// registerCreator for each -- and records every registry call made from inside the loader's own calls into the
// library (re-entry, which TensorRT does not allow). Used by tests/test_tensorrt_plugins.py only.
#include <NvInferRuntime.h>
#include <dlfcn.h>

#include "tensorrt_registry_compat.h"

#include <cstdio>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

class StderrLogger final : public ILogger {
 public:
  void log(Severity, const char* msg) noexcept override { std::fprintf(stderr, "[fake nvinfer] %s\n", msg); }
};

class RecordingRegistry final : public IPluginRegistry {
 public:
  DCNKIT_TEST_REGISTRY_V2_METHODS
  using IPluginRegistry::registerCreator;
  using IPluginRegistry::deregisterCreator;
  std::vector<std::string> keys;  // "namespace::name" of the registered creators
  std::vector<IPluginCreatorInterface*> creators;
  std::string reentries;  // registry calls made while the library's entry points ran
  int calls = 0;          // registry calls from outside (the library included)
  bool in_library = false;

  bool enter(const char* what) {
    ++calls;
    if (in_library) reentries += std::string(what) + ";";
    return !in_library;
  }

  void setErrorRecorder(IErrorRecorder* const) noexcept override { enter("setErrorRecorder"); }
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
  bool isParentSearchEnabled() const override { return false; }
  void setParentSearchEnabled(bool const) override { enter("setParentSearchEnabled"); }
  PluginLibraryHandle loadLibrary(AsciiChar const* path) noexcept override {
    if (!enter("loadLibrary")) return nullptr;
    in_library = true;  // from dlopen (static initialisers) to getCreators, no registry call may come back
    void* lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      in_library = false;
      return nullptr;
    }
    using SetFinder = void (*)(ILoggerFinder*);
    using GetCreators = IPluginCreatorInterface* const* (*)(int32_t&);
    auto set_finder = reinterpret_cast<SetFinder>(dlsym(lib, "setLoggerFinder"));
    auto get_creators = reinterpret_cast<GetCreators>(dlsym(lib, "getCreators"));
    if (get_creators == nullptr) {
      in_library = false;
      return nullptr;
    }
    if (set_finder != nullptr) set_finder(nullptr);
    int32_t n = 0;
    IPluginCreatorInterface* const* list = get_creators(n);
    in_library = false;
    for (int32_t i = 0; i < n; ++i) {
      auto* v3 = static_cast<IPluginCreatorV3One*>(list[i]);
      add(*list[i], v3->getPluginNamespace());
    }
    return lib;
  }
  void deregisterLibrary(PluginLibraryHandle) noexcept override { enter("deregisterLibrary"); }
  bool add(IPluginCreatorInterface& creator, AsciiChar const* ns) {
    auto* v3 = static_cast<IPluginCreatorV3One*>(&creator);
    const std::string key = std::string(ns) + "::" + v3->getPluginName();
    for (const auto& k : keys)
      if (k == key) return false;  // TensorRT refuses a second creator of one (name, version, namespace)
    keys.push_back(key);
    creators.push_back(&creator);
    return true;
  }
  bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept override {
    return enter("registerCreator") && add(creator, ns);
  }
  IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override {
    *n = static_cast<int32_t>(creators.size());
    return creators.data();
  }
  IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const,
                                      AsciiChar const* const) noexcept override {
    enter("getCreator");
    return nullptr;
  }
  bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override {
    if (!enter("deregisterCreator")) return false;
    for (size_t i = 0; i < creators.size(); ++i) {
      if (creators[i] == &creator) {
        creators.erase(creators.begin() + static_cast<long>(i));
        keys.erase(keys.begin() + static_cast<long>(i));
        return true;
      }
    }
    return false;
  }
  IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override { return nullptr; }
  int32_t releasePluginResource(AsciiChar const*) noexcept override { return 0; }
  IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept {  // 10.13+: overrides
    return getAllCreators(n);
  }
};

RecordingRegistry g_registry;
StderrLogger g_logger;

}  // namespace

// The release it stands for: that of the headers, or -DDCNKIT_FAKE_INFER_VERSION (a release no build serves).
extern "C" __attribute__((visibility("default"))) int32_t getInferLibVersion() noexcept {
#ifdef DCNKIT_FAKE_INFER_VERSION
  return DCNKIT_FAKE_INFER_VERSION;
#else
  return NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH;
#endif
}

extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept { return &g_registry; }

extern "C" __attribute__((visibility("default"))) ILogger* getLogger() noexcept { return &g_logger; }

// For the tests: the registered keys, separated by ";"; the re-entrant calls; the number of registry calls.
extern "C" __attribute__((visibility("default"))) const char* fake_registered_keys() {
  static std::string out;
  out.clear();
  for (const auto& k : g_registry.keys) out += k + ";";
  return out.c_str();
}
extern "C" __attribute__((visibility("default"))) const char* fake_reentries() { return g_registry.reentries.c_str(); }
extern "C" __attribute__((visibility("default"))) int fake_registry_calls() { return g_registry.calls; }
