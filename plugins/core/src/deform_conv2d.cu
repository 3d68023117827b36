// DeformConv2d CUDA launchers: grid-stride kernels over the per-element functions of
// deform_conv2d_kernels.h (the ones the CPU launchers use), GEMM through the context (cuBLAS / ATen) on
// the context's stream. Forward: float32, float64, float16, bfloat16 (float accumulation for the 16-bit
// types); backward: float32, float64 (atomicAdd for the input-gradient scatter).
//
// Per chunk of images: im2col into the workspace, columns (chunk, Cin*K, P) in the storage type, then one
// strided-batched GEMM per convolution group (batched over the images of the chunk, weight shared).
#include <algorithm>

#include "dcnkit/cuda_utils.cuh"
#include "dcnkit/deform_conv2d.h"
#include "dcnkit/deform_conv2d_kernels.h"

namespace dcnkit {

namespace {

// Bytes of columns per chunk of images (at least one image).
constexpr int64_t kCudaColumnBytes = int64_t(256) << 20;

int64_t images_per_chunk(const DeformConv2dParams& p, DType dtype) {
  const int64_t per_image = std::max<int64_t>(
      1, p.in_channels * p.kernel_size() * p.out_spatial() * static_cast<int64_t>(dtype_size(dtype)));
  return std::max<int64_t>(1, std::min<int64_t>(p.batch, kCudaColumnBytes / per_image));
}

size_t column_bytes(const DeformConv2dParams& p, DType dtype) {
  return align_up(static_cast<size_t>(images_per_chunk(p, dtype) * p.in_channels * p.kernel_size() *
                                      p.out_spatial()) *
                  dtype_size(dtype));
}

// Atomic on the device, plain += when the same code is compiled for the host.
struct AtomicAdd {
  template <typename T, typename Acc>
  __host__ __device__ __forceinline__ void operator()(T* dst, Acc v) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(dst, static_cast<T>(v));
#else
    *dst += static_cast<T>(v);
#endif
  }
};

template <typename T> DType dtype_enum();
template <> DType dtype_enum<float>() { return DType::kFloat32; }
template <> DType dtype_enum<double>() { return DType::kFloat64; }
template <> DType dtype_enum<__half>() { return DType::kFloat16; }
template <> DType dtype_enum<__nv_bfloat16>() { return DType::kBFloat16; }

// columns[b][c*K + k][pos] for the images n0 .. n0+nb.
template <typename T>
__global__ void im2col_kernel(DeformConv2dParams p, const T* __restrict__ input,
                              const T* __restrict__ offset, const T* __restrict__ mask, int64_t n0,
                              int64_t nb, T* __restrict__ columns) {
  using Acc = typename AccType<T>::type;
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const int64_t Cin = p.in_channels, Gd = p.attrs.deformable_groups;
  const int64_t total = nb * Cin * K * P;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    const int64_t pos = idx % P;
    const int64_t ck = (idx / P) % (Cin * K);
    const int64_t b = idx / (P * Cin * K);
    const int64_t c = ck / K, k = ck % K;
    const int64_t n = n0 + b;
    const T* x_n = input + n * Cin * p.height * p.width;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    columns[idx] = from_acc<T>(deform_conv2d_column<Acc, T>(p, x_n, off_n, mask_n, c, k, pos));
  }
}

// output[n][co][pos] = bias[co] for the images n0 .. n0+nb.
template <typename T>
__global__ void fill_bias_kernel(const T* __restrict__ bias, int64_t cout, int64_t P, int64_t n0,
                                 int64_t nb, T* __restrict__ output) {
  const int64_t total = nb * cout * P;
  T* out = output + n0 * cout * P;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) { out[idx] = bias[(idx / P) % cout]; }
}

// grad_input += scatter of grad_columns (images n0 .. n0+nb).
template <typename T>
__global__ void col2im_kernel(DeformConv2dParams p, const T* __restrict__ offset,
                              const T* __restrict__ mask, const T* __restrict__ grad_columns,
                              int64_t n0, int64_t nb, T* __restrict__ grad_input) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const int64_t Cin = p.in_channels, Gd = p.attrs.deformable_groups;
  const int64_t total = nb * Cin * K * P;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    const int64_t pos = idx % P;
    const int64_t ck = (idx / P) % (Cin * K);
    const int64_t b = idx / (P * Cin * K);
    const int64_t c = ck / K, k = ck % K;
    const int64_t n = n0 + b;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    T* gin_n = grad_input + n * Cin * p.height * p.width;
    deform_conv2d_scatter_input<T, T>(p, off_n, mask_n, grad_columns[idx], c, k, pos, gin_n, AtomicAdd());
  }
}

// grad_offset / grad_mask of every (image, g, k, pos) of the chunk.
template <typename T>
__global__ void offset_mask_grad_kernel(DeformConv2dParams p, const T* __restrict__ input,
                                        const T* __restrict__ offset, const T* __restrict__ mask,
                                        const T* __restrict__ grad_columns, int64_t n0, int64_t nb,
                                        T* __restrict__ grad_offset, T* __restrict__ grad_mask) {
  const int64_t K = p.kernel_h * p.kernel_w, P = p.out_h * p.out_w;
  const int64_t Cin = p.in_channels, Gd = p.attrs.deformable_groups;
  const int64_t total = nb * Gd * K * P;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    const int64_t pos = idx % P;
    const int64_t gk = (idx / P) % (Gd * K);
    const int64_t b = idx / (P * Gd * K);
    const int64_t g = gk / K, k = gk % K;
    const int64_t n = n0 + b;
    const T* x_n = input + n * Cin * p.height * p.width;
    const T* off_n = offset + n * 2 * Gd * K * P;
    const T* mask_n = mask ? mask + n * Gd * K * P : nullptr;
    const T* gcol_b = grad_columns + b * Cin * K * P;
    T gy, gx, gm;
    deform_conv2d_offset_mask_grad<T, T>(p, x_n, off_n, mask_n, gcol_b + pos, P, g, k, pos, &gy, &gx, &gm);
    if (grad_offset) {
      T* go = grad_offset + n * 2 * Gd * K * P;
      go[(g * 2 * K + 2 * k) * P + pos] = gy;
      go[(g * 2 * K + 2 * k + 1) * P + pos] = gx;
    }
    if (grad_mask) grad_mask[n * Gd * K * P + (g * K + k) * P + pos] = gm;
  }
}

// grad_bias[co] = sum over n, pos of grad_output[n][co][pos]: one block per channel, fixed order.
template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ grad_output, int64_t N, int64_t cout, int64_t P,
                                 T* __restrict__ grad_bias) {
  __shared__ T partial[kCudaThreads];
  for (int64_t co = blockIdx.x; co < cout; co += gridDim.x) {
    T s = T(0);
    for (int64_t i = threadIdx.x; i < N * P; i += blockDim.x) {
      const int64_t n = i / P, q = i % P;
      s += grad_output[(n * cout + co) * P + q];
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) grad_bias[co] = partial[0];
    __syncthreads();
  }
}

template <typename T>
Status forward_impl(const DeformConv2dParams& p, const T* input, const T* offset, const T* weight,
                    const T* bias, const T* mask, T* output, void* workspace, const CudaContext& ctx) {
  const int64_t N = p.batch, P = p.out_spatial();
  if (N == 0 || P == 0 || p.out_channels == 0) return Status::Ok();
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const DType dt = dtype_enum<T>();
  const int64_t K = p.kernel_size(), Cin = p.in_channels, Cout = p.out_channels;
  const int64_t G = p.attrs.groups, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  const int64_t chunk = images_per_chunk(p, dt);
  T* columns = static_cast<T*>(workspace);
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nb = std::min(chunk, N - n0);
    const int64_t total = nb * Cin * K * P;
    im2col_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, input, offset, mask, n0, nb, columns);
    DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_forward_cuda: im2col"));
    if (bias) {
      fill_bias_kernel<T><<<cuda_blocks(nb * Cout * P), kCudaThreads, 0, stream>>>(bias, Cout, P, n0, nb, output);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_forward_cuda: bias"));
    }
    for (int64_t gc = 0; gc < G; ++gc) {
      GemmArgs ga;
      ga.dtype = dt;
      ga.m = cout_g;
      ga.n = P;
      ga.k = cin_g * K;
      ga.beta = bias ? 1.f : 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = columns + gc * cin_g * K * P;
      ga.ldb = P;
      ga.stride_b = Cin * K * P;
      ga.c = output + n0 * Cout * P + gc * cout_g * P;
      ga.ldc = P;
      ga.stride_c = Cout * P;
      ga.batch = nb;
      DCNKIT_RETURN_IF_ERROR(ctx.run_gemm(ga));
    }
  }
  return Status::Ok();
}

template <typename T>
Status backward_impl(const DeformConv2dParams& p, const T* grad_output, const T* input, const T* offset,
                     const T* weight, const T* mask, T* grad_input, T* grad_offset, T* grad_weight,
                     T* grad_bias, T* grad_mask, void* workspace, const CudaContext& ctx) {
  cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  const DType dt = dtype_enum<T>();
  const int64_t N = p.batch, P = p.out_spatial();
  const int64_t K = p.kernel_size(), Cin = p.in_channels, Cout = p.out_channels;
  const int64_t Gd = p.attrs.deformable_groups, HW = p.height * p.width;
  const int64_t G = p.attrs.groups, cin_g = p.in_per_group(), cout_g = p.out_per_group();
  if (!mask) grad_mask = nullptr;

  if (grad_input) {
    DCNKIT_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(grad_input, 0, sizeof(T) * static_cast<size_t>(N * Cin * HW), stream),
        "deform_conv2d_backward_cuda: memset"));
  }
  if (grad_weight) {
    DCNKIT_RETURN_IF_ERROR(cuda_status(
        cudaMemsetAsync(grad_weight, 0, sizeof(T) * static_cast<size_t>(Cout * cin_g * K), stream),
        "deform_conv2d_backward_cuda: memset"));
  }
  if (grad_bias) {
    if (N * P == 0) {
      DCNKIT_RETURN_IF_ERROR(cuda_status(cudaMemsetAsync(grad_bias, 0, sizeof(T) * static_cast<size_t>(Cout), stream),
                                         "deform_conv2d_backward_cuda: memset"));
    } else if (Cout > 0) {
      const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(Cout, 65535));
      bias_grad_kernel<T><<<blocks, kCudaThreads, 0, stream>>>(grad_output, N, Cout, P, grad_bias);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_backward_cuda: bias"));
    }
  }
  const bool need_gcol = grad_input || grad_offset || grad_mask;
  if (N == 0 || P == 0 || (!need_gcol && !grad_weight)) return Status::Ok();

  const int64_t chunk = images_per_chunk(p, dt);
  T* columns = static_cast<T*>(workspace);  // columns, then their gradient (stream-ordered reuse)
  for (int64_t n0 = 0; n0 < N; n0 += chunk) {
    const int64_t nb = std::min(chunk, N - n0);
    const int64_t total = nb * Cin * K * P;
    if (grad_weight) {
      im2col_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, input, offset, mask, n0, nb, columns);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_backward_cuda: im2col"));
      for (int64_t b = 0; b < nb; ++b) {
        // grad_weight[gc] += grad_out[n][gc] (Cout_g x P) x columns[b][gc]^T (P x Cin_g*K), batched over gc.
        GemmArgs ga;
        ga.dtype = dt;
        ga.trans_b = true;
        ga.m = cout_g;
        ga.n = cin_g * K;
        ga.k = P;
        ga.beta = 1.f;
        ga.a = grad_output + (n0 + b) * Cout * P;
        ga.lda = P;
        ga.stride_a = cout_g * P;
        ga.b = columns + b * Cin * K * P;
        ga.ldb = P;
        ga.stride_b = cin_g * K * P;
        ga.c = grad_weight;
        ga.ldc = cin_g * K;
        ga.stride_c = cout_g * cin_g * K;
        ga.batch = G;
        DCNKIT_RETURN_IF_ERROR(ctx.run_gemm(ga));
      }
    }
    if (!need_gcol) continue;
    for (int64_t gc = 0; gc < G; ++gc) {
      // grad_columns[b][gc] = W[gc]^T (Cin_g*K x Cout_g) x grad_out[n][gc] (Cout_g x P), batched over b.
      GemmArgs ga;
      ga.dtype = dt;
      ga.trans_a = true;
      ga.m = cin_g * K;
      ga.n = P;
      ga.k = cout_g;
      ga.beta = 0.f;
      ga.a = weight + gc * cout_g * cin_g * K;
      ga.lda = cin_g * K;
      ga.stride_a = 0;
      ga.b = grad_output + n0 * Cout * P + gc * cout_g * P;
      ga.ldb = P;
      ga.stride_b = Cout * P;
      ga.c = columns + gc * cin_g * K * P;
      ga.ldc = P;
      ga.stride_c = Cin * K * P;
      ga.batch = nb;
      DCNKIT_RETURN_IF_ERROR(ctx.run_gemm(ga));
    }
    if (grad_input) {
      col2im_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, offset, mask, columns, n0, nb, grad_input);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_backward_cuda: col2im"));
    }
    if (grad_offset || grad_mask) {
      const int64_t items = nb * Gd * K * P;
      offset_mask_grad_kernel<T><<<cuda_blocks(items), kCudaThreads, 0, stream>>>(
          p, input, offset, mask, columns, n0, nb, grad_offset, grad_mask);
      DCNKIT_RETURN_IF_ERROR(cuda_launch_status("deform_conv2d_backward_cuda: offset/mask grad"));
    }
  }
  return Status::Ok();
}

}  // namespace

size_t deform_conv2d_forward_workspace_cuda(const DeformConv2dParams& p, DType dtype) {
  return column_bytes(p, dtype);
}

size_t deform_conv2d_backward_workspace_cuda(const DeformConv2dParams& p, DType dtype) {
  return column_bytes(p, dtype);
}

Status deform_conv2d_forward_cuda(const DeformConv2dParams& p, DType dtype, const void* input,
                                  const void* offset, const void* weight, const void* bias,
                                  const void* mask, void* output, void* workspace,
                                  const CudaContext& ctx) {
#define DCNKIT_FWD(T)                                                                              \
  forward_impl<T>(p, static_cast<const T*>(input), static_cast<const T*>(offset),                 \
                  static_cast<const T*>(weight), static_cast<const T*>(bias),                     \
                  static_cast<const T*>(mask), static_cast<T*>(output), workspace, ctx)
  switch (dtype) {
    case DType::kFloat32: return DCNKIT_FWD(float);
    case DType::kFloat64: return DCNKIT_FWD(double);
    case DType::kFloat16: return DCNKIT_FWD(__half);
    case DType::kBFloat16: return DCNKIT_FWD(__nv_bfloat16);
  }
#undef DCNKIT_FWD
  return arg_error("deform_conv2d", "input", "dtype float32, float64, float16 or bfloat16", dtype_name(dtype));
}

Status deform_conv2d_backward_cuda(const DeformConv2dParams& p, DType dtype, const void* grad_output,
                                   const void* input, const void* offset, const void* weight,
                                   const void* mask, void* grad_input, void* grad_offset,
                                   void* grad_weight, void* grad_bias, void* grad_mask,
                                   void* workspace, const CudaContext& ctx) {
#define DCNKIT_BWD(T)                                                                               \
  backward_impl<T>(p, static_cast<const T*>(grad_output), static_cast<const T*>(input),            \
                   static_cast<const T*>(offset), static_cast<const T*>(weight),                   \
                   static_cast<const T*>(mask), static_cast<T*>(grad_input),                       \
                   static_cast<T*>(grad_offset), static_cast<T*>(grad_weight),                     \
                   static_cast<T*>(grad_bias), static_cast<T*>(grad_mask), workspace, ctx)
  switch (dtype) {
    case DType::kFloat32: return DCNKIT_BWD(float);
    case DType::kFloat64: return DCNKIT_BWD(double);
    default: break;
  }
#undef DCNKIT_BWD
  return arg_error("_deform_conv2d_backward", "input", "dtype float32 or float64 (CUDA backward)",
                   dtype_name(dtype));
}

}  // namespace dcnkit
