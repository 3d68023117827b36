// A stand-in for TensorRT's libnvinfer (built with its soname) for the self-registration test: it exports
// the two functions the plugin library looks up (getInferLibVersion, getPluginRegistry) and a registry that
// records what is registered. Never used outside tests/test_tensorrt_plugins.py.
#include <NvInferRuntime.h>

#include <cstring>
#include <string>
#include <vector>

using namespace nvinfer1;

namespace {

class RecordingRegistry final : public IPluginRegistry {
 public:
  std::vector<std::string> keys;  // "namespace::name" of the registered creators
  std::vector<IPluginCreatorInterface*> creators;

  void setErrorRecorder(IErrorRecorder* const) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
  bool isParentSearchEnabled() const override { return false; }
  void setParentSearchEnabled(bool const) override {}
  PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
  void deregisterLibrary(PluginLibraryHandle) noexcept override {}
  bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept override {
    auto* v3 = static_cast<IPluginCreatorV3One*>(&creator);
    keys.push_back(std::string(ns) + "::" + v3->getPluginName());
    creators.push_back(&creator);
    return true;
  }
  IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override {
    *n = static_cast<int32_t>(creators.size());
    return creators.data();
  }
  IPluginCreatorInterface* getCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const) noexcept override {
    return nullptr;
  }
  bool deregisterCreator(IPluginCreatorInterface const& creator) noexcept override {
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
  IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept override { return getAllCreators(n); }
};

RecordingRegistry g_registry;

}  // namespace

extern "C" __attribute__((visibility("default"))) int32_t getInferLibVersion() noexcept {
  return NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH;
}

extern "C" __attribute__((visibility("default"))) IPluginRegistry* getPluginRegistry() noexcept { return &g_registry; }

// For the test: the registered keys, separated by ";".
extern "C" __attribute__((visibility("default"))) const char* fake_registered_keys() {
  static std::string out;
  out.clear();
  for (const auto& k : g_registry.keys) out += k + ";";
  return out.c_str();
}
