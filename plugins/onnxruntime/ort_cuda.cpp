// CUDA execution-provider kernels (libdcnkit_ort_cuda.so only): the core CUDA launchers on ONNX Runtime's
// compute stream, GEMM through cuBLAS on that stream (dcnkit/cublas_gemm.h), scratch memory from the kernel
// context's stream-ordered scratch buffer (ort_scratch.h).
//
// cuBLAS handles: only a node whose op runs a GEMM (OpDef::gemm) has one, created with the kernel (create_cuda_state,
// on the device of the node's allocator) so that Compute never calls cublasCreate, which allocates and may
// synchronise. Compute creates it only when that failed or the run's device differs (a handle belongs to the device
// it was created on). The other ops never get one.
#include <cuda_runtime.h>

#include <memory>

#include "dcnkit/cublas_gemm.h"
#include "ort_kernels.h"
#include "ort_scratch.h"

namespace dcnkit::ort {

struct CudaState {
  CublasGemm gemm;  // the node's cuBLAS handle, bound to ORT's compute stream on every run
  int device = -1;
};

void destroy_cuda_state(CudaState* s) {
  if (s == nullptr) return;
  if (s->gemm.handle != nullptr) cublasDestroy(s->gemm.handle);
  delete s;
}

namespace {

bool runs_gemm(const Kernel& k) { return op_of(k).def.gemm; }

// (Re)creates the handle of `s` on `device`, the current device.
Status make_handle(CudaState* s, int device) {
  if (s->gemm.handle != nullptr) cublasDestroy(s->gemm.handle);
  s->gemm.handle = nullptr;
  s->device = -1;
  DCNKIT_RETURN_IF_ERROR(cublas_status(cublasCreate(&s->gemm.handle), "cublasCreate"));
  s->device = device;
  return Status::Ok();
}

// The device of the node's default (device) allocator; -1 when ONNX Runtime does not say (C API < 18 has no
// KernelInfoGetAllocator).
int kernel_device(const OrtKernelInfo* info) {
  int id = -1;
#if ORT_API_VERSION >= 18
  const OrtApi& a = api();
  OrtAllocator* alloc = nullptr;
  if (api_version() >= 18 && from_ort(a.KernelInfoGetAllocator(info, OrtMemTypeDefault, &alloc), "").ok() &&
      alloc != nullptr) {
    const OrtMemoryInfo* mem = nullptr;
    if (!from_ort(a.AllocatorGetInfo(alloc, &mem), "").ok() || mem == nullptr ||
        !from_ort(a.MemoryInfoGetId(mem, &id), "").ok()) {
      id = -1;
    }
    a.ReleaseAllocator(alloc);
  }
#else
  (void)info;
#endif
  return id;
}

Status prepare(Kernel& k, OrtKernelContext* ctx, CudaContext* out) {
  void* stream = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetGPUComputeStream(ctx, &stream), "GetGPUComputeStream"));
  out->stream = stream;
  if (!runs_gemm(k)) return Status::Ok();  // no GEMM, no handle
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::DeviceError("cudaGetDevice failed");
  if (k.cuda_state == nullptr) k.cuda_state = new CudaState();
  CudaState* s = k.cuda_state;
  // Made with the kernel (create_cuda_state); here only if that failed or the run is on another device.
  if (s->gemm.handle == nullptr || s->device != device) DCNKIT_RETURN_IF_ERROR(make_handle(s, device));
  s->gemm.stream = static_cast<cudaStream_t>(stream);
  out->gemm = &cublas_gemm;
  out->gemm_self = &s->gemm;
  return Status::Ok();
}

}  // namespace

void create_cuda_state(Kernel& k, const OrtKernelInfo* info) {
  if (!runs_gemm(k)) return;
  int current = 0;
  if (cudaGetDevice(&current) != cudaSuccess) return;  // Compute reports it
  const int device = kernel_device(info);
  const bool other = device >= 0 && device != current;
  if (other && cudaSetDevice(device) != cudaSuccess) return;
  auto s = std::make_unique<CudaState>();
  if (make_handle(s.get(), other ? device : current).ok()) k.cuda_state = s.release();
  if (other) cudaSetDevice(current);
}

Status compute_cuda(Kernel& k, OrtKernelContext* ctx) {
  std::unique_lock<std::mutex> lock(k.mutex, std::defer_lock);
  if (runs_gemm(k)) lock.lock();  // one run at a time on the node's cuBLAS handle
  Run r;
  DCNKIT_RETURN_IF_ERROR(prepare_run(k, ctx, &r));
  if (r.empty) return Status::Ok();
  CudaContext cuda;
  DCNKIT_RETURN_IF_ERROR(prepare(k, ctx, &cuda));
  OpDevice dev;
  dev.cuda = &cuda;  // a bad RoI batch index or level table gives zeros (no synchronisation to report it)
  const OpEntry& e = op_of(k).entry;
  if (e.forward_cuda == nullptr) return Status::Internal("no CUDA kernel for this op in this library");
  const size_t ws = e.workspace ? e.workspace(r.call, Pass::kForward, r.types, dev) : 0;
  const size_t missing = missing_output_bytes(r, r.types.dtype);
  StreamScratch scratch;  // stream-ordered (ort_scratch.h), on the device of the first input
  if (ws + missing > 0) {
    const OrtValue* first = r.inputs.in[features_input(op_of(k).def)].value;
    if (first == nullptr) first = r.inputs.variadic.empty() ? nullptr : r.inputs.variadic[0].value;
    const OrtMemoryInfo* mem = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().GetTensorMemoryInfo(first, &mem), "GetTensorMemoryInfo"));
    DCNKIT_RETURN_IF_ERROR(scratch.allocate(ctx, mem, align_up(ws) + missing));
  }
  r.buffers.workspace = ws > 0 ? scratch.data() : nullptr;
  if (missing > 0) place_missing_outputs(&r, r.types.dtype, static_cast<char*>(scratch.data()) + align_up(ws));
  return e.forward_cuda(r.call, r.types, r.buffers, dev);
}

}  // namespace dcnkit::ort
