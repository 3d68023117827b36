// The C entry points of libdcnkit_trt.so (exports.map lists them; nothing else is exported).
//
//   getCreators, setLoggerFinder   what IPluginRegistry::loadLibrary looks up (trtexec --dynamicPlugins,
//                                  trt.get_plugin_registry().load_library): a static list and a logger
//                                  pointer; neither calls into a registry. The list leaves out the plugin
//                                  names TensorRT's own plugin library registers (loadLibrary would fail)
//   dcnkit_trt_register_creators   explicit registration, for libdcnkit_trt_autoreg.so (trt_autoreg.cpp)
//   dcnkit_op_defs_json            the op table (plugins/core), shared by every dcnkit library
#pragma once

#include <NvInferRuntime.h>

#include <cstdint>

extern "C" {
void setLoggerFinder(nvinfer1::ILoggerFinder* finder);
nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

// Registers every creator with `registry`, the plugin registry of the libnvinfer whose getInferLibVersion() is
// `infer_lib_version`: those of getCreators, and those of TensorRT's own plugin names that getCreators leaves out
// (MultiscaleDeformableAttnPlugin_TRT, see trt_creators.cpp). The registry is called through the vtable of
// `infer_lib_version`'s major (trt_host_abi.h); a major this library does not serve registers nothing (one line on
// stderr) and the result is -1. Returns the number of creators registered (a creator of getCreators the registry
// refuses is logged as an error and skipped; one of TensorRT's names, with an info line: TensorRT's own serves it).
int32_t dcnkit_trt_register_creators(nvinfer1::IPluginRegistry* registry, int32_t infer_lib_version);
}
