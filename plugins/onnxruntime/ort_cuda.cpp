// CUDA execution-provider kernels (libdcnkit_ort_cuda.so only): the core CUDA launchers on ONNX Runtime's
// compute stream, GEMM through cuBLAS on that stream, scratch memory from the kernel context's
// stream-ordered scratch buffer (ort_scratch.h).
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <climits>
#include <memory>

#include "ort_kernels.h"
#include "ort_scratch.h"

namespace dcnkit::ort {

struct CudaState {
  cublasHandle_t handle = nullptr;
  int device = -1;
  cudaStream_t stream = nullptr;
};

void destroy_cuda_state(CudaState* s) {
  if (s == nullptr) return;
  if (s->handle != nullptr) cublasDestroy(s->handle);
  delete s;
}

namespace {

Status cublas_status(cublasStatus_t st, const char* where) {
  if (st == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::DeviceError(std::string(where) + ": cuBLAS status " + std::to_string(static_cast<int>(st)));
}

// Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T: swap the operands.
Status cublas_gemm(void* self, const GemmArgs& g) {
  auto* s = static_cast<CudaState*>(self);
  if (g.m <= 0 || g.n <= 0 || g.batch <= 0) return Status::Ok();
  const int64_t lim = INT_MAX;
  if (g.m > lim || g.n > lim || g.k > lim || g.lda > lim || g.ldb > lim || g.ldc > lim || g.batch > lim) {
    return Status::Invalid("gemm: matrix too large for cuBLAS 32-bit sizes");
  }
  DCNKIT_RETURN_IF_ERROR(cublas_status(cublasSetStream(s->handle, s->stream), "cublasSetStream"));
  const cublasOperation_t ta = g.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t tb = g.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const int m = static_cast<int>(g.m), n = static_cast<int>(g.n), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(g.lda > 0 ? g.lda : 1), ldb = static_cast<int>(g.ldb > 0 ? g.ldb : 1),
            ldc = static_cast<int>(g.ldc > 0 ? g.ldc : 1), batch = static_cast<int>(g.batch);
  const float alpha = g.alpha, beta = g.beta;
  switch (g.dtype) {
    case DType::kFloat32:
      return cublas_status(
          cublasSgemmStridedBatched(s->handle, tb, ta, n, m, k, &alpha, static_cast<const float*>(g.b), ldb,
                                    g.stride_b, static_cast<const float*>(g.a), lda, g.stride_a, &beta,
                                    static_cast<float*>(g.c), ldc, g.stride_c, batch),
          "cublasSgemmStridedBatched");
    case DType::kFloat16:
      return cublas_status(
          cublasGemmStridedBatchedEx(s->handle, tb, ta, n, m, k, &alpha, g.b, CUDA_R_16F, ldb, g.stride_b, g.a,
                                     CUDA_R_16F, lda, g.stride_a, &beta, g.c, CUDA_R_16F, ldc, g.stride_c, batch,
                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "cublasGemmStridedBatchedEx(float16)");
    case DType::kFloat64: {
      const double a64 = g.alpha, b64 = g.beta;
      return cublas_status(
          cublasDgemmStridedBatched(s->handle, tb, ta, n, m, k, &a64, static_cast<const double*>(g.b), ldb,
                                    g.stride_b, static_cast<const double*>(g.a), lda, g.stride_a, &b64,
                                    static_cast<double*>(g.c), ldc, g.stride_c, batch),
          "cublasDgemmStridedBatched");
    }
    default:
      return Status::Internal(std::string("gemm: unsupported dtype ") + dtype_name(g.dtype));
  }
}

Status prepare(Kernel& k, OrtKernelContext* ctx, CudaContext* out) {
  void* stream = nullptr;
  DCNKIT_RETURN_IF_ERROR(from_ort(api().KernelContext_GetGPUComputeStream(ctx, &stream), "GetGPUComputeStream"));
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::DeviceError("cudaGetDevice failed");
  if (k.cuda_state == nullptr) k.cuda_state = new CudaState();
  CudaState* s = k.cuda_state;
  if (s->handle == nullptr || s->device != device) {
    if (s->handle != nullptr) cublasDestroy(s->handle);
    s->handle = nullptr;
    DCNKIT_RETURN_IF_ERROR(cublas_status(cublasCreate(&s->handle), "cublasCreate"));
    s->device = device;
  }
  s->stream = static_cast<cudaStream_t>(stream);
  out->stream = stream;
  out->gemm = &cublas_gemm;
  out->gemm_self = s;
  return Status::Ok();
}

DType dtype_of(const Kernel& k) {
  return k.dtype == ONNX_TENSOR_ELEMENT_DATA_TYPE_FLOAT16 ? DType::kFloat16 : DType::kFloat32;
}

const void* ptr(const TensorView& t) { return t.present() ? t.data : nullptr; }

}  // namespace

Status compute_cuda(Kernel& k, OrtKernelContext* ctx) {
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
  }
  return Status::Internal("unknown op kind");
}

}  // namespace dcnkit::ort
