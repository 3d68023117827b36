// One TensorRT major's host-side calls (trt_host_abi.h). CMake compiles this file once per major it has headers for,
// with -DDCNKIT_TRT_ABI=<major> and `nvinfer1` renamed to a per-major namespace (-Dnvinfer1=...): the two copies of
// TensorRT's interfaces in one library then have different names, and each object calls its major's vtable slots.
#include <NvInferRuntime.h>

#define DCNKIT_ABI_JOIN2(a, b) a##b
#define DCNKIT_ABI_JOIN(a, b) DCNKIT_ABI_JOIN2(a, b)
#define DCNKIT_ABI_NS DCNKIT_ABI_JOIN(abi, DCNKIT_TRT_ABI)

static_assert(NV_TENSORRT_MAJOR == DCNKIT_TRT_ABI, "trt_abi_shim.cpp: the headers are not of DCNKIT_TRT_ABI's major");

namespace dcnkit::trt::DCNKIT_ABI_NS {

void* find_logger(void* finder) { return static_cast<nvinfer1::ILoggerFinder*>(finder)->findLogger(); }

void log(void* logger, int severity, const char* message) {
  static_cast<nvinfer1::ILogger*>(logger)->log(static_cast<nvinfer1::ILogger::Severity>(severity), message);
}

bool register_creator(void* registry, void* creator, const char* plugin_namespace) {
  return static_cast<nvinfer1::IPluginRegistry*>(registry)->registerCreator(
      *static_cast<nvinfer1::IPluginCreatorInterface*>(creator), plugin_namespace);
}

// libdcnkit_trt_autoreg.so: libnvinfer's global logger (getLogger) behind this major's ILoggerFinder.
namespace {
class NvinferLoggerFinder final : public nvinfer1::ILoggerFinder {
 public:
  void* (*get_logger)() = nullptr;
  nvinfer1::ILogger* findLogger() override {
    return get_logger != nullptr ? static_cast<nvinfer1::ILogger*>(get_logger()) : nullptr;
  }
};
}  // namespace

void* nvinfer_logger_finder(void* (*get_logger)()) {
  static NvinferLoggerFinder finder;
  finder.get_logger = get_logger;
  return &finder;
}

}  // namespace dcnkit::trt::DCNKIT_ABI_NS
