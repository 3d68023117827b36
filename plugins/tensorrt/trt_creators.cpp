// The plugin creators and the library's two entry points (getCreators, setLoggerFinder): one creator per
// operator variant of dcnkit/op_attrs.h -- the kit's ops (namespace "dcnkit") and the names mmdeploy /
// mmcv export (namespace ""), version "1" -- so models from either exporter build unchanged. Loaded by a
// plain dlopen into a process that has TensorRT, the library registers them itself (SelfRegistration).
#include <dlfcn.h>

#include <cstring>
#include <exception>
#include <memory>

#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {

extern ILoggerFinder* g_logger_finder;

namespace {

class Creator final : public IPluginCreatorV3One {
 public:
  explicit Creator(const OpVariant* v) : variant_(v) { declare_fields(*v, &fields_); }

  IPluginV3* createPlugin(const char* name, const PluginFieldCollection* fc, TensorRTPhase phase) noexcept override {
    try {
      const std::string node = name ? name : "";
      OpAttrs attrs;
      const Status s = attrs_from_fields(*variant_, fc, &attrs);
      if (!s.ok()) {
        // One line naming the op, the node and the field (the core's message names the op and field).
        log_error(std::string("createPlugin(") + variant_->op_type + ", node '" + node + "', " +
                  (phase == TensorRTPhase::kRUNTIME ? "runtime" : "build") + "): " + s.message());
        return nullptr;
      }
      return make_plugin(variant_, attrs, node);
    } catch (const std::exception& e) {
      log_error(std::string("createPlugin(") + variant_->op_type + "): " + e.what());
      return nullptr;
    }
  }

  const PluginFieldCollection* getFieldNames() noexcept override { return fields_.collection(); }
  const char* getPluginName() const noexcept override { return variant_->op_type; }
  const char* getPluginVersion() const noexcept override { return kPluginVersion; }
  const char* getPluginNamespace() const noexcept override { return plugin_namespace(*variant_); }

 private:
  const OpVariant* variant_;
  FieldStore fields_;
};

// The kit's own ops, then the first variant of every other op type (mmdeploy's and mmcv's domains carry
// the same names; TensorRT has no domains).
struct Creators {
  std::vector<std::unique_ptr<Creator>> owned;
  std::vector<IPluginCreatorInterface*> list;
  Creators() {
    std::vector<std::string> seen;
    for (const OpVariant& v : op_variants()) {
      if (v.kind == OpKind::kMultiScaleDeformableAttention) continue;  // no TensorRT plugin yet
      bool dup = false;
      for (const auto& s : seen) dup = dup || s == v.op_type;
      if (dup) continue;
      seen.emplace_back(v.op_type);
      owned.push_back(std::make_unique<Creator>(&v));
      list.push_back(owned.back().get());
    }
  }
};

Creators& creators() {
  static Creators c;
  return c;
}

// Loaders that only dlopen a plugin library (Triton's `plugins=` option, LD_PRELOAD, Polygraphy's
// --plugins) never call getCreators. When the library is loaded into a process that already has
// TensorRT's libnvinfer of the major version of the headers we were built with (the registry's vtable is
// that version's), it registers its creators with that process's registry itself; getCreators
// (IPluginRegistry::loadLibrary, trtexec --dynamicPlugins) takes them back first, so TensorRT registers
// them the usual way. Everything is looked up with dlsym: the library still links nothing from TensorRT.
struct SelfRegistration {
  IPluginRegistry* registry = nullptr;
  std::vector<IPluginCreatorInterface*> registered;

  SelfRegistration() {
    const std::string soname = "libnvinfer.so." + std::to_string(NV_TENSORRT_MAJOR);
    void* lib = dlopen(soname.c_str(), RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) return;  // no TensorRT in the process yet: getCreators will be called
    using Version = int32_t (*)();
    using Registry = IPluginRegistry* (*)();
    auto version = reinterpret_cast<Version>(dlsym(lib, "getInferLibVersion"));
    auto get_registry = reinterpret_cast<Registry>(dlsym(lib, "getPluginRegistry"));
    if (version != nullptr && get_registry != nullptr && version() / 10000 == NV_TENSORRT_MAJOR) {
      registry = get_registry();
      for (IPluginCreatorInterface* c : creators().list) {
        auto* v3 = static_cast<IPluginCreatorV3One*>(c);
        if (registry != nullptr && registry->registerCreator(*c, v3->getPluginNamespace())) registered.push_back(c);
      }
      log(ILogger::Severity::kINFO, "registered " + std::to_string(registered.size()) + " plugin creators with " +
                                        soname + " (loaded without getCreators)");
    }
    dlclose(lib);  // balances the RTLD_NOLOAD reference; libnvinfer stays loaded
  }

  // Takes the creators back before TensorRT registers them through getCreators.
  void release() {
    for (IPluginCreatorInterface* c : registered) registry->deregisterCreator(*c);
    registered.clear();
  }
};

SelfRegistration& self_registration() {
  static SelfRegistration r;
  return r;
}

// At load time (a static object's constructor runs when the library is dlopen'ed).
const bool g_self_registered = (self_registration(), true);

}  // namespace
}  // namespace dcnkit::trt

extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  dcnkit::trt::g_logger_finder = finder;
}

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(
    int32_t& nbCreators) {
  dcnkit::trt::self_registration().release();
  auto& c = dcnkit::trt::creators();
  nbCreators = static_cast<int32_t>(c.list.size());
  return c.list.data();
}
