// The plugin creators and the library's two entry points (getCreators, setLoggerFinder): one creator per
// operator variant of dcnkit/op_attrs.h -- the kit's ops (namespace "dcnkit") and the names mmdeploy /
// mmcv export (namespace ""), version "1" -- so models from either exporter build unchanged.
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

}  // namespace
}  // namespace dcnkit::trt

extern "C" __attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  dcnkit::trt::g_logger_finder = finder;
}

extern "C" __attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(
    int32_t& nbCreators) {
  auto& c = dcnkit::trt::creators();
  nbCreators = static_cast<int32_t>(c.list.size());
  return c.list.data();
}
