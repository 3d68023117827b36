// Logging through the logger TensorRT hands to setLoggerFinder, called through the ABI of the TensorRT that runs
// (trt_host_abi.h); stderr where there is none, or where this library does not serve the running release.
#include <atomic>
#include <cstdio>

#include "trt_host_abi.h"
#include "trt_plugin.h"

using namespace nvinfer1;

namespace dcnkit::trt {
namespace {

std::atomic<void*> g_finder{nullptr};
std::atomic<bool> g_refused{false};

}  // namespace

void set_logger_finder(void* finder) { g_finder.store(finder); }

int served_running_major(const char* what) {
  int32_t version = 0;
  int major = running_major(g_finder.load(), &version);
  if (major == 0) major = NV_TENSORRT_MAJOR;  // nothing tells: the release of the headers this file was built with
  if (serves_major(major)) return major;
  if (!g_refused.exchange(true)) {
    std::fprintf(stderr, "dcnkit: libdcnkit_trt.so serves TensorRT %s; this process runs %s: %s\n",
                 served_majors_text().c_str(), release_text(version).c_str(), what);
  }
  return 0;
}

void log(ILogger::Severity severity, const std::string& message) {
  const std::string line = "dcnkit: " + message;
  void* finder = g_finder.load();
  const int major = finder != nullptr ? served_running_major("no plugin is offered and nothing is called") : 0;
  void* logger = major != 0 ? find_logger(major, finder) : nullptr;
  if (logger != nullptr) {
    log_with(major, logger, static_cast<int>(severity), line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

void log_error(const std::string& message) { log(ILogger::Severity::kERROR, message); }

}  // namespace dcnkit::trt
