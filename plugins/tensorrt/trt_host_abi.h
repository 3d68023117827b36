// The host side of TensorRT that the plugin library calls: the logger finder and logger TensorRT hands over, and
// the plugin registry (dcnkit_trt_register_creators). Their layout changed in TensorRT 11.0: ILogger and
// ILoggerFinder gained the base IVersionedInterface (findLogger moved from vtable slot 0 to 4, log moved too) and
// IPluginRegistry lost its IPluginV2 methods (registerCreator(IPluginCreatorInterface&, ...) moved from slot 12 to
// 8). The plugin-side interfaces (IPluginV3*, IPluginCreatorV3One, tensor descriptors, PluginField, IExprBuilder)
// are the same from 10.0 to 11.x. So the library finds the running release's major once and makes these calls
// through that major's ABI only (trt_abi_shim.cpp, compiled once per major with that major's headers); a major it
// was not built for gets one line on stderr and no call at all.
#pragma once

#include <cstdint>
#include <string>

namespace dcnkit::trt {

// The TensorRT majors this library can serve (the shims it was built with), e.g. "10.x and 11.x".
std::string served_majors_text();
bool serves_major(int major);

// The running TensorRT's major: a loaded libnvinfer / libnvinfer_lean / libnvinfer_dispatch (its
// getInferLibVersion, else its soname), else a getInferLibVersion of the process (a host linked statically),
// else the type of `finder` (ILoggerFinder is nvinfer1::v_1_0::ILoggerFinder from 11.0, nvinfer1::ILoggerFinder
// before), else 0 (unknown). `version` receives the full version (major * 10000 + minor * 100 + patch) where a
// getInferLibVersion said it, else major * 10000.
int running_major(const void* finder, int32_t* version = nullptr);
// "TensorRT 10.3.0" (or "TensorRT 10.x" when only the major is known, "an unknown TensorRT").
std::string release_text(int32_t version);

// Calls through the ABI of `major` (a served one): finder->findLogger(), logger->log(), and
// registry->registerCreator(IPluginCreatorInterface&, ns).
void* find_logger(int major, void* finder);
void log_with(int major, void* logger, int severity, const char* message);
bool register_creator(int major, void* registry, void* creator, const char* plugin_namespace);

}  // namespace dcnkit::trt
