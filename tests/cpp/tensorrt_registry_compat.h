// The IPluginRegistry methods a TensorRT release has beyond those every release from 10.0 to 11.x shares, for the
// test registries (tensorrt_registry_checks.h, fake_nvinfer.cpp) to compile against each release's headers: 10.x
// still has IPluginV2's (its creators are not the kit's: refused). getAllCreatorsRecursive (10.13 and later) is
// written without `override` in the registries, which then compile with and without it.
#pragma once

#if NV_TENSORRT_MAJOR < 11
#define DCNKIT_TEST_REGISTRY_V2_METHODS                                                                        \
  bool registerCreator(IPluginCreator&, AsciiChar const* const) noexcept override { return false; }           \
  IPluginCreator* const* getPluginCreatorList(int32_t* const n) const noexcept override {                      \
    *n = 0;                                                                                                    \
    return nullptr;                                                                                            \
  }                                                                                                            \
  IPluginCreator* getPluginCreator(AsciiChar const* const, AsciiChar const* const, AsciiChar const* const)     \
      noexcept override {                                                                                      \
    return nullptr;                                                                                            \
  }                                                                                                            \
  bool deregisterCreator(IPluginCreator const&) noexcept override { return false; }
#else
#define DCNKIT_TEST_REGISTRY_V2_METHODS
#endif
