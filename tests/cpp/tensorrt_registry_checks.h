// Registration through dcnkit_trt_register_creators (what libdcnkit_trt_autoreg.so calls) into a registry of this
// test's own: every expected creator, those of getCreators and TensorRT's own plugin names that getCreators leaves
// out; and, where the registry holds TensorRT's own creator of such a name already, the rest registered without an
// error. Included once, inside tensorrt_lifecycle_test.cpp's namespace, after run_case.
#pragma once

// A plugin registry that keeps what is registered and refuses a second creator of one (namespace, name, version).
class TestRegistry final : public IPluginRegistry {
 public:
  DCNKIT_TEST_REGISTRY_V2_METHODS
  using IPluginRegistry::registerCreator;
  using IPluginRegistry::deregisterCreator;
  std::vector<IPluginCreatorInterface*> creators;

  static std::string key(IPluginCreatorInterface& c, const char* ns) {
    auto& v3 = static_cast<IPluginCreatorV3One&>(c);
    return std::string(ns) + "::" + v3.getPluginName() + "/" + v3.getPluginVersion();
  }
  bool registerCreator(IPluginCreatorInterface& creator, AsciiChar const* const ns) noexcept override {
    for (IPluginCreatorInterface* c : creators) {
      if (key(*c, static_cast<IPluginCreatorV3One*>(c)->getPluginNamespace()) == key(creator, ns)) return false;
    }
    creators.push_back(&creator);
    return true;
  }
  IPluginCreatorInterface* const* getAllCreators(int32_t* const n) const noexcept override {
    *n = static_cast<int32_t>(creators.size());
    return creators.data();
  }
  IPluginCreatorInterface* getCreator(AsciiChar const* const name, AsciiChar const* const version,
                                      AsciiChar const* const ns) noexcept override {
    for (IPluginCreatorInterface* c : creators) {
      auto* v3 = static_cast<IPluginCreatorV3One*>(c);
      if (std::strcmp(v3->getPluginName(), name) == 0 && std::strcmp(v3->getPluginVersion(), version) == 0 &&
          std::strcmp(v3->getPluginNamespace(), ns) == 0) {
        return c;
      }
    }
    return nullptr;
  }
  void setErrorRecorder(IErrorRecorder* const) noexcept override {}
  IErrorRecorder* getErrorRecorder() const noexcept override { return nullptr; }
  bool isParentSearchEnabled() const override { return false; }
  void setParentSearchEnabled(bool const) override {}
  PluginLibraryHandle loadLibrary(AsciiChar const*) noexcept override { return nullptr; }
  void deregisterLibrary(PluginLibraryHandle) noexcept override {}
  bool deregisterCreator(IPluginCreatorInterface const&) noexcept override { return false; }
  IPluginResource* acquirePluginResource(AsciiChar const*, IPluginResource*) noexcept override { return nullptr; }
  int32_t releasePluginResource(AsciiChar const*) noexcept override { return 0; }
  IPluginCreatorInterface* const* getAllCreatorsRecursive(int32_t* const n) noexcept {  // 10.13+: overrides
    return getAllCreators(n);
  }
};

// A creator standing for one of TensorRT's own plugin library (same name, version and namespace).
class TensorRTOwnCreator final : public IPluginCreatorV3One {
 public:
  explicit TensorRTOwnCreator(const char* name) : name_(name) {}
  IPluginV3* createPlugin(AsciiChar const*, PluginFieldCollection const*, TensorRTPhase) noexcept override {
    return nullptr;
  }
  PluginFieldCollection const* getFieldNames() noexcept override { return &fields_; }
  AsciiChar const* getPluginName() const noexcept override { return name_; }
  AsciiChar const* getPluginVersion() const noexcept override { return "1"; }
  AsciiChar const* getPluginNamespace() const noexcept override { return ""; }

 private:
  const char* name_;
  PluginFieldCollection fields_{};
};

using RegisterCreators = int32_t (*)(IPluginRegistry*, int32_t);

int32_t infer_lib_version() { return NV_TENSORRT_MAJOR * 10000 + NV_TENSORRT_MINOR * 100 + NV_TENSORRT_PATCH; }

// Registers the library's creators into `registry`; checks the count and that no warning or error was logged.
void check_registered(RegisterCreators reg, TestRegistry* registry, size_t want, const std::string& what) {
  const size_t before = g_logger.lines.size();
  const int32_t n = reg(registry, infer_lib_version());
  check(n == static_cast<int32_t>(want) && g_logger.lines.size() == before,
        what + ": dcnkit_trt_register_creators registers " + std::to_string(want) + " creators (got " +
            std::to_string(n) + ") without a warning (got: " +
            (g_logger.lines.size() > before ? g_logger.lines.back() : std::string()) + ")");
}

// TensorRT's own plugin names: registered through dcnkit_trt_register_creators into an empty registry, skipped
// quietly where the registry has TensorRT's creator of the name, and never in getCreators' list.
void check_tensorrt_own_names(RegisterCreators reg, IPluginCreatorInterface* const* list, int32_t n,
                              const std::vector<Case>& cs) {
  for (const Case& c : cs) {
    if (!c.tensorrt_own_name) continue;
    bool listed = false;
    for (int32_t i = 0; i < n; ++i) {
      listed = listed || std::strcmp(static_cast<IPluginCreatorV3One*>(list[i])->getPluginName(), c.name) == 0;
    }
    check(!listed, std::string(c.name) + ": not in getCreators (loadLibrary fails when TensorRT's own is registered)");
    TestRegistry with_own;
    TensorRTOwnCreator own(c.name);
    with_own.registerCreator(own, "");
    check_registered(reg, &with_own, cs.size() - 1, std::string("a registry with TensorRT's own ") + c.name);
    check(with_own.getCreator(c.name, "1", "") == &own, std::string(c.name) + ": TensorRT's own creator stays");
  }
}
