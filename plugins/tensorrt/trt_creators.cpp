// The plugin creators and the library's entry points: one creator per operator variant of the op table -- the kit's
// ops (namespace "dcnkit"), the names mmdeploy / mmcv export and TensorRT's own plugin names (namespace ""), version
// "1" -- so models from either exporter build unchanged.
//
// getCreators and setLoggerFinder are what IPluginRegistry::loadLibrary calls (trtexec --dynamicPlugins,
// trt.get_plugin_registry().load_library): they only hand over a static list and a pointer, and never call
// into a registry (the loader registers the list itself, in whichever registry it serves). Loading the
// library does nothing either. Loaders that only dlopen a library take libdcnkit_trt_autoreg.so
// (trt_autoreg.cpp), which calls dcnkit_trt_register_creators below.
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>

#include "trt_entry_points.h"
#include "trt_host_abi.h"
#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {
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

// Plugin names that TensorRT's own plugin library (libnvinfer_plugin: initLibNvInferPlugins, which trtexec and the
// kit's tools call) registers with the same version ("1") and namespace (""). IPluginRegistry::loadLibrary fails
// for the whole library when any creator it gets from getCreators is registered already, so these creators are
// not in getCreators' list: dcnkit_trt_register_creators (libdcnkit_trt_autoreg.so) offers them, and where the
// registry holds TensorRT's own creator already, that one serves the nodes.
// Those are the declarations' TensorRT-only names (OpVariant::tensorrt_only: TensorRT's own plugin names).
bool registered_by_tensorrt_itself(const OpVariant& v) { return v.tensorrt_only; }

// The kit's own ops, then the first variant of every other op type (mmdeploy's and mmcv's domains carry
// the same names; TensorRT has no domains).
struct Creators {
  std::vector<std::unique_ptr<Creator>> owned;
  std::vector<IPluginCreatorInterface*> list;         // getCreators
  std::vector<IPluginCreatorInterface*> tensorrt_own;  // registered_by_tensorrt_itself
  Creators() {
    std::vector<std::string> seen;
    for (const OpVariant& v : op_variants()) {
      if (v.onnx_standard) continue;  // ONNX's own DeformConv: TensorRT's ONNX parser imports it natively
      bool dup = false;
      for (const auto& s : seen) dup = dup || s == v.op_type;
      if (dup) continue;
      seen.emplace_back(v.op_type);
      owned.push_back(std::make_unique<Creator>(&v));
      (registered_by_tensorrt_itself(v) ? tensorrt_own : list).push_back(owned.back().get());
    }
  }
};

Creators& creators() {
  static Creators c;
  return c;
}

}  // namespace
}  // namespace dcnkit::trt

// The finder is kept as an opaque pointer: its layout is that of the running TensorRT (trt_host_abi.h).
extern "C" __attribute__((visibility("default"))) void setLoggerFinder(ILoggerFinder* finder) {
  dcnkit::trt::set_logger_finder(finder);
}

// No creator for a TensorRT this library does not serve (one line on stderr says which it found and serves).
extern "C" __attribute__((visibility("default"))) IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  auto& c = dcnkit::trt::creators();
  const bool served = dcnkit::trt::served_running_major("getCreators offers no plugin creator") != 0;
  nbCreators = served ? static_cast<int32_t>(c.list.size()) : 0;
  return c.list.data();
}

extern "C" __attribute__((visibility("default"))) int32_t dcnkit_trt_register_creators(IPluginRegistry* registry,
                                                                                      int32_t infer_lib_version) {
  using dcnkit::trt::log;
  using dcnkit::trt::log_error;
  // getInferLibVersion(): major * 10000 + ... from 10.0, major * 1000 + ... before.
  const int32_t major = infer_lib_version >= 100000 ? infer_lib_version / 10000 : infer_lib_version / 1000;
  if (registry == nullptr || !dcnkit::trt::serves_major(major)) {
    std::fprintf(stderr, "dcnkit: dcnkit_trt_register_creators: expected the plugin registry of TensorRT %s, got %s; "
                 "no creator registered\n", dcnkit::trt::served_majors_text().c_str(),
                 registry == nullptr ? "no registry" : ("getInferLibVersion " + std::to_string(infer_lib_version)).c_str());
    return -1;
  }
  const auto register_one = [&](IPluginCreatorInterface* c) {
    return dcnkit::trt::register_creator(major, registry, c, static_cast<IPluginCreatorV3One*>(c)->getPluginNamespace());
  };
  const auto& all = dcnkit::trt::creators();
  int32_t registered = 0;
  for (IPluginCreatorInterface* c : all.list) {
    auto* v3 = static_cast<IPluginCreatorV3One*>(c);
    if (register_one(c)) {
      ++registered;
    } else {
      log_error(std::string("the registry refused the creator ") + v3->getPluginNamespace() + "::" +
                v3->getPluginName() + " version " + v3->getPluginVersion() +
                " (already registered: is libdcnkit_trt.so loaded twice, or another library with this name?)");
    }
  }
  for (IPluginCreatorInterface* c : all.tensorrt_own) {
    auto* v3 = static_cast<IPluginCreatorV3One*>(c);
    if (register_one(c)) {
      ++registered;
    } else {
      log(ILogger::Severity::kINFO, std::string("not registering ") + v3->getPluginName() + " version " +
                                        v3->getPluginVersion() +
                                        ": the registry has one (TensorRT's own plugin library's), which serves it");
    }
  }
  log(ILogger::Severity::kINFO, "registered " + std::to_string(registered) + " of " +
                                    std::to_string(all.list.size() + all.tensorrt_own.size()) +
                                    " plugin creators through dcnkit_trt_register_creators");
  return registered;
}
