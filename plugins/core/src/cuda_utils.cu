#include "dcnkit/cuda_utils.cuh"

namespace dcnkit {

Status error_flag_reset(DeviceErrorFlag f, cudaStream_t stream) {
  return cuda_status(cudaMemsetAsync(f.flag, 0, sizeof(int), stream), "error_flag_reset");
}

Status error_flag_check(DeviceErrorFlag f, cudaStream_t stream, const std::string& message) {
  int host = 0;
  DCNKIT_RETURN_IF_ERROR(cuda_status(
      cudaMemcpyAsync(&host, f.flag, sizeof(int), cudaMemcpyDeviceToHost, stream), "error_flag_check"));
  DCNKIT_RETURN_IF_ERROR(cuda_status(cudaStreamSynchronize(stream), "error_flag_check"));
  return host ? Status::Invalid(message) : Status::Ok();
}

}  // namespace dcnkit
