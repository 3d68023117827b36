// CUDA execution-provider kernels (libdcnkit_ort_cuda.so only): the core CUDA launchers on ONNX Runtime's
// compute stream, GEMM through cuBLAS on that stream (dcnkit/cublas_gemm.h), scratch memory from the kernel
// context's stream-ordered scratch buffer (ort_scratch.h).
//
// cuBLAS handles: only a node whose op runs a GEMM (OpDef::gemm: DeformConv2d) has one, created with the kernel
// (create_cuda_state, on the device of the node's allocator) so that Compute never calls cublasCreate, which
// allocates and may synchronise. Compute creates it only when that failed or the run's device differs (a
// handle belongs to the device it was created on). DCNv3, DCNv4, MSDA and the RoI ops never get one.
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

bool runs_gemm(const Kernel& k) { return op_def(k.variant->kind).gemm; }

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

DType dtype_of(const Kernel& k) {
  return k.dtype == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? DType::kFloat16 : DType::kFloat32;
}

const void* ptr(const TensorView& t) { return t.present() ? t.data : nullptr; }

}  // namespace

namespace {

Status compute_multi_level_cuda(Kernel& k, OrtKernelContext* ctx) {
  TensorView rois;
  std::vector<TensorView> features;
  DCNKIT_RETURN_IF_ERROR(gather_multi_level_inputs(k, ctx, &rois, &features));
  void* stream = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetGPUComputeStream(ctx, &stream), "GetGPUComputeStream"));
  CudaContext cuda;
  cuda.stream = stream;  // no GEMM
  MultiLevelRoIAlignParams p;
  void* y = nullptr;
  DCNKIT_RETURN_IF_ERROR(prepare_multi_level_run(k, rois, features, ctx, &p, &y));
  if (y == nullptr) return Status::Ok();
  std::vector<const void*> f;
  for (const TensorView& t : features) f.push_back(ptr(t));
  const size_t bytes = multi_level_roi_align_workspace_cuda(p);
  StreamScratch ws;  // stream-ordered (ort_scratch.h); empty today
  if (bytes > 0) {
    const OrtMemoryInfo* mem = nullptr;
    DCNKIT_RETURN_IF_ERROR(from_ort(api().GetTensorMemoryInfo(rois.value, &mem), "GetTensorMemoryInfo"));
    DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, bytes));
  }
  // A RoI whose batch index is outside [0, N) gives zeros (no synchronisation to report it).
  return multi_level_roi_align_forward_cuda(p, dtype_of(k), f.data(), ptr(rois), y, ws.data(), cuda);
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
  if (k.variant->kind == OpKind::kMultiLevelRoIAlign) return compute_multi_level_cuda(k, ctx);
  std::lock_guard<std::mutex> lock(k.mutex);
  TensorView in[kMaxInputs];
  DCNKIT_RETURN_IF_ERROR(gather_inputs(k, ctx, in, kMaxInputs));
  CudaContext cuda;
  DCNKIT_RETURN_IF_ERROR(prepare(k, ctx, &cuda));
  const DType dt = dtype_of(k);
  // Workspace on the device the inputs live on.
  const OrtMemoryInfo* mem = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().GetTensorMemoryInfo(in[kDcInput].value, &mem), "GetTensorMemoryInfo"));

  void* y = nullptr;

  switch (k.variant->kind) {
    case OpKind::kDeformConv2d: {
      DeformConv2dParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      StreamScratch ws;  // stream-ordered (ort_scratch.h)
      DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, deform_conv2d_forward_workspace_cuda(p, dt)));
      return deform_conv2d_forward_cuda(p, dt, ptr(in[kDcInput]), ptr(in[kDcOffset]), ptr(in[kDcWeight]),
                                        ptr(in[kDcBias]), ptr(in[kDcMask]), y, ws.data(), cuda);
    }
    case OpKind::kRoIAlign: {
      RoIAlignParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      StreamScratch ws;  // stream-ordered (ort_scratch.h)
      DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, roi_align_workspace_cuda(p)));
      return roi_align_forward_cuda(p, dt, ptr(in[kRaInput]), ptr(in[kRaRois]), y, ws.data(), cuda);
    }
    case OpKind::kDeformRoIPool: {
      DeformRoIPoolParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      StreamScratch ws;  // stream-ordered (ort_scratch.h)
      DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, deform_roi_pool_workspace_cuda(p)));
      return deform_roi_pool_forward_cuda(p, dt, ptr(in[kDrInput]), ptr(in[kDrRois]), ptr(in[kDrOffset]), y,
                                          ws.data(), cuda);
    }
    case OpKind::kDeformPSRoIPool: {
      DeformPSRoIPoolParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      void* count = nullptr;
      DCNKIT_RETURN_IF_ERROR(optional_output(ctx, 1, p.output_shape(), &count));
      // The launcher always writes the count: give it device scratch when the model does not want it.
      int64_t numel = 1;
      for (int64_t d : p.output_shape()) numel *= d;
      const size_t count_bytes = count == nullptr ? align_up(static_cast<size_t>(numel) * dtype_size(dt)) : 0;
      const size_t ws_bytes = deform_psroi_pool_workspace_cuda(p);
      StreamScratch ws;  // stream-ordered (ort_scratch.h)
      DCNKIT_RETURN_IF_ERROR(ws.allocate(ctx, mem, count_bytes + ws_bytes));
      if (count == nullptr) count = ws.data();
      void* launcher_ws = ws_bytes ? static_cast<char*>(ws.data()) + count_bytes : nullptr;
      return deform_psroi_pool_forward_cuda(p, dt, ptr(in[kPsInput]), ptr(in[kPsRois]), ptr(in[kPsTrans]), y, count,
                                            launcher_ws, cuda);
    }
    case OpKind::kMultiLevelRoIAlign: break;  // compute_multi_level_cuda
    case OpKind::kMultiScaleDeformableAttention: {
      MsdaParams p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      // The level tables stay on the device: a bad table gives zeros (msda_levels_valid; no sync to report it).
      return msda_forward_cuda(p, dt, ptr(in[kMsdaValue]), static_cast<const int64_t*>(ptr(in[kMsdaSpatialShapes])),
                               static_cast<const int64_t*>(ptr(in[kMsdaLevelStart])), ptr(in[kMsdaLocations]),
                               ptr(in[kMsdaWeights]), y, cuda);
    }
    case OpKind::kDCNv3:
    case OpKind::kDCNv4: {  // DCNv4 reads its weights from offset_mask (p.fused)
      Dcnv3Params p;
      DCNKIT_RETURN_IF_ERROR(prepare_run(k, in, ctx, &p, &y));
      const void* offset = ptr(in[kD3Offset]);
      return dcnv3_forward_cuda(p, dt, ptr(in[kD3Input]), offset, p.fused ? offset : ptr(in[kD3Mask]), y, cuda);
    }
  }
  return Status::Internal("unknown op kind");
}

}  // namespace dcnkit::ort
