// DeformConv2d CUDA launchers: grid-stride kernels over the per-element functions of
// deform_conv2d_kernels.h (the ones the CPU launchers use), GEMM through the context (cuBLAS / ATen) on
// the context's stream. float32, float64, float16 and bfloat16, forward and backward; the accumulation type
// follows the data (float for float and the 16-bit types, double for double). Backward of the 16-bit types:
// the input-gradient scatter and the grad_weight sum over images accumulate in float32 buffers of the
// workspace (rounded once at the end); their GEMMs run in the storage type with float32 compute (the
// context's GEMM). float and double scatter with atomicAdd in place.
//
// The schedule (chunks of images, GEMM arguments) and the per-thread element functions live in
// deform_conv2d_kernels.h, where the CPU runs them too (DCNKIT_DCN_CPU_PATH=cuda-schedule); this file only
// launches them. Per chunk of images: im2col into the workspace, columns (chunk, Cin*K, P) in the storage
// type, then one strided-batched GEMM per convolution group (batched over the images of the chunk).
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

// Atomic on the device, plain += when the same code is compiled for the host. The destination is the
// accumulation type (float or double), so nothing is converted.
struct AtomicAdd {
  template <typename Acc>
  __host__ __device__ __forceinline__ void operator()(Acc* dst, Acc v) const {
#if defined(__CUDA_ARCH__)
    atomicAdd(dst, v);
#else
    *dst += v;
#endif
  }
};

// Elements of grad_weight (Cout, Cin/groups, kh, kw).
int64_t weight_elements(const DeformConv2dParams& p) {
  return p.out_channels * p.in_per_group() * p.kernel_size();
}

// Workspace of the backward beyond the columns: for 16-bit types the float32 accumulators of grad_input and
// grad_weight and one image's grad_weight GEMM result in the storage type.
size_t backward_extra_bytes(const DeformConv2dParams& p, DType dtype) {
  if (!is_16bit(dtype)) return 0;
  return grad_acc_bytes(dtype, p.batch * p.in_channels * p.height * p.width) +
         grad_acc_bytes(dtype, weight_elements(p)) +
         align_up(static_cast<size_t>(weight_elements(p)) * dtype_size(dtype));
}

template <typename T> DType dtype_enum();
template <> DType dtype_enum<float>() { return DType::kFloat32; }
template <> DType dtype_enum<double>() { return DType::kFloat64; }
template <> DType dtype_enum<__half>() { return DType::kFloat16; }
template <> DType dtype_enum<__nv_bfloat16>() { return DType::kBFloat16; }

// One thread per (image of the chunk, input channel, output position), looping over the kernel points
// (deform_conv2d_im2col_row); the other kernels: one thread per element, the element functions of
// deform_conv2d_kernels.h.
template <typename T>
__global__ void __launch_bounds__(kCudaThreads)
    im2col_kernel(DeformConv2dParams p, const T* __restrict__ input, const T* __restrict__ offset,
                  const T* __restrict__ mask, int64_t n0, int64_t total, T* __restrict__ columns) {
  using Acc = typename AccType<T>::type;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    deform_conv2d_im2col_row<Acc, T>(p, input, offset, mask, n0, idx, columns);
  }
}

template <typename T>
__global__ void fill_bias_kernel(DeformConv2dParams p, const T* __restrict__ bias, int64_t n0,
                                 int64_t total, T* __restrict__ output) {
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) { deform_conv2d_bias_element(p, bias, n0, idx, output); }
}

// Scatters into grad_input's accumulation buffer (the accumulation type): one thread per (image, input
// channel, output position), looping over the kernel points (deform_conv2d_col2im_row).
template <typename T, typename Acc>
__global__ void __launch_bounds__(kCudaThreads)
    col2im_kernel(DeformConv2dParams p, const T* __restrict__ offset, const T* __restrict__ mask,
                  const T* __restrict__ grad_columns, int64_t n0, int64_t total, Acc* __restrict__ grad_input) {
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    deform_conv2d_col2im_row<Acc, T>(p, offset, mask, grad_columns, n0, idx, grad_input, AtomicAdd());
  }
}

template <typename T>
__global__ void offset_mask_grad_kernel(DeformConv2dParams p, const T* __restrict__ input,
                                        const T* __restrict__ offset, const T* __restrict__ mask,
                                        const T* __restrict__ grad_columns, int64_t n0, int64_t total,
                                        T* __restrict__ grad_offset, T* __restrict__ grad_mask) {
  using Acc = typename AccType<T>::type;
  DCNKIT_CUDA_KERNEL_LOOP(idx, total) {
    deform_conv2d_offset_mask_grad_element<T, Acc>(p, input, offset, mask, grad_columns, n0, idx, grad_offset,
                                                   grad_mask);
  }
}

// acc[i] += v[i] (the float32 sum over images of 16-bit grad_weight GEMM results).
template <typename T, typename Acc>
__global__ void accumulate_kernel(const T* __restrict__ v, int64_t n, Acc* __restrict__ acc) {
  DCNKIT_CUDA_KERNEL_LOOP(i, n) { acc[i] += to_acc<Acc>(v[i]); }
}

// grad_bias[co] = sum over n, pos of grad_output[n][co][pos]: one block per channel, fixed order, in the
// accumulation type.
template <typename T>
__global__ void bias_grad_kernel(const T* __restrict__ grad_output, int64_t N, int64_t cout, int64_t P,
                                 T* __restrict__ grad_bias) {
  using Acc = typename AccType<T>::type;
  __shared__ Acc partial[kCudaThreads];
  for (int64_t co = blockIdx.x; co < cout; co += gridDim.x) {
    Acc s = Acc(0);
    for (int64_t i = threadIdx.x; i < N * P; i += blockDim.x) {
      const int64_t n = i / P, q = i % P;
      s += to_acc<Acc>(grad_output[(n * cout + co) * P + q]);
    }
    partial[threadIdx.x] = s;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
      if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
      __syncthreads();
    }
    if (threadIdx.x == 0) grad_bias[co] = from_acc<T>(partial[0]);
    __syncthreads();
  }
}

// The executor of the schedule (deform_conv2d_kernels.h): kernels and GEMMs on the context's stream.
// grad_input and grad_weight go through their accumulation targets (GradAcc: in place for float and
// double, float32 workspace for 16-bit types); weight_tmp holds one image's grad_weight GEMM result for
// 16-bit types (null otherwise).
template <typename T>
struct CudaExec {
  using Acc = typename AccType<T>::type;
  const DeformConv2dParams& p;
  const CudaContext& ctx;
  cudaStream_t stream;
  const T *input, *offset, *mask, *bias, *grad_output;
  T *output, *grad_offset, *grad_bias, *grad_mask;
  GradAcc<T> grad_input, grad_weight;
  T* weight_tmp;

  Status im2col(int64_t n0, int64_t nb, T* columns) {
    const int64_t total = nb * p.in_channels * p.out_spatial();  // threads: (image, channel, position)
    im2col_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, input, offset, mask, n0, total,
                                                                       columns);
    return cuda_launch_status("deform_conv2d_cuda: im2col");
  }
  Status bias_fill(int64_t n0, int64_t nb) {
    const int64_t total = nb * p.out_channels * p.out_spatial();
    fill_bias_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, bias, n0, total, output);
    return cuda_launch_status("deform_conv2d_cuda: bias");
  }
  Status col2im(int64_t n0, int64_t nb, const T* grad_columns) {
    const int64_t total = nb * p.in_channels * p.out_spatial();  // threads: (image, channel, position)
    col2im_kernel<T, Acc><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(p, offset, mask, grad_columns, n0,
                                                                            total, grad_input.acc);
    return cuda_launch_status("deform_conv2d_cuda: col2im");
  }
  Status offset_mask_grad(int64_t n0, int64_t nb, const T* grad_columns) {
    const int64_t total = nb * p.attrs.deformable_groups * p.kernel_size() * p.out_spatial();
    offset_mask_grad_kernel<T><<<cuda_blocks(total), kCudaThreads, 0, stream>>>(
        p, input, offset, mask, grad_columns, n0, total, grad_offset, grad_mask);
    return cuda_launch_status("deform_conv2d_cuda: offset/mask grad");
  }
  Status bias_grad() {
    const int64_t N = p.batch, P = p.out_spatial(), Cout = p.out_channels;
    if (Cout == 0) return Status::Ok();
    if (N * P == 0) return zero(grad_bias, Cout);
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(Cout, 65535));
    bias_grad_kernel<T><<<blocks, kCudaThreads, 0, stream>>>(grad_output, N, Cout, P, grad_bias);
    return cuda_launch_status("deform_conv2d_cuda: bias grad");
  }
  Status zero(T* dst, int64_t count) {
    if (count <= 0) return Status::Ok();
    return cuda_status(cudaMemsetAsync(dst, 0, sizeof(T) * static_cast<size_t>(count), stream),
                       "deform_conv2d_cuda: memset");
  }
  Status gemm(const GemmArgs& ga) { return ctx.run_gemm(ga); }
  // float, double: C += A x B^T in place. 16-bit types: the image's product into weight_tmp, added to the
  // float32 accumulator (a 16-bit running sum over images would round at every image).
  Status weight_gemm(const GemmArgs& ga) {
    if (weight_tmp == nullptr) return gemm(ga);
    GemmArgs g = ga;
    g.beta = 0.f;
    g.c = weight_tmp;  // same layout as grad_weight (ldc, stride_c)
    DCNKIT_RETURN_IF_ERROR(gemm(g));
    const int64_t n = weight_elements(p);
    accumulate_kernel<T, Acc><<<cuda_blocks(n), kCudaThreads, 0, stream>>>(weight_tmp, n, grad_weight.acc);
    return cuda_launch_status("deform_conv2d_cuda: grad_weight sum");
  }
};

template <typename T>
Status forward_impl(const DeformConv2dParams& p, const T* input, const T* offset, const T* weight,
                    const T* bias, const T* mask, T* output, void* workspace, const CudaContext& ctx) {
  CudaExec<T> ex{p, ctx, static_cast<cudaStream_t>(ctx.stream), input, offset, mask, bias, nullptr,
                 output, nullptr, nullptr, nullptr, GradAcc<T>{}, GradAcc<T>{}, nullptr};
  return deform_conv2d_forward_schedule<T>(p, dtype_enum<T>(), images_per_chunk(p, dtype_enum<T>()), weight,
                                           bias != nullptr, output, static_cast<T*>(workspace), ex);
}

template <typename T>
Status backward_impl(const DeformConv2dParams& p, const T* grad_output, const T* input, const T* offset,
                     const T* weight, const T* mask, T* grad_input, T* grad_offset, T* grad_weight,
                     T* grad_bias, T* grad_mask, void* workspace, const CudaContext& ctx) {
  const cudaStream_t stream = static_cast<cudaStream_t>(ctx.stream);
  // Workspace: columns, then (16-bit types) the float32 accumulators and weight_tmp.
  char* extra = static_cast<char*>(workspace) + column_bytes(p, dtype_enum<T>());
  const GradAcc<T> gin = grad_acc(grad_input, p.batch * p.in_channels * p.height * p.width, &extra);
  const GradAcc<T> gw = grad_acc(grad_weight, weight_elements(p), &extra);
  constexpr bool in_place = std::is_same<typename AccType<T>::type, T>::value;
  T* weight_tmp = (!in_place && grad_weight != nullptr) ? reinterpret_cast<T*>(extra) : nullptr;
  CudaExec<T> ex{p, ctx, stream, input, offset, mask, nullptr, grad_output, nullptr, grad_offset, grad_bias,
                 mask ? grad_mask : nullptr, gin, gw, weight_tmp};
  // In place (float, double) the schedule zeroes grad_input / grad_weight itself; the float32
  // accumulators of 16-bit types are zeroed here and rounded into the gradients after the schedule.
  if (!in_place) {
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gin, stream, "deform_conv2d_cuda: memset"));
    DCNKIT_RETURN_IF_ERROR(grad_acc_zero(gw, stream, "deform_conv2d_cuda: memset"));
  }
  DCNKIT_RETURN_IF_ERROR(deform_conv2d_backward_schedule<T>(
      p, dtype_enum<T>(), images_per_chunk(p, dtype_enum<T>()), grad_output, weight, mask != nullptr, grad_input,
      grad_offset, grad_weight, grad_bias, grad_mask, static_cast<T*>(workspace), ex));
  DCNKIT_RETURN_IF_ERROR(grad_acc_store(gin, stream, "deform_conv2d_cuda: grad_input store"));
  return grad_acc_store(gw, stream, "deform_conv2d_cuda: grad_weight store");
}

}  // namespace

size_t deform_conv2d_forward_workspace_cuda(const DeformConv2dParams& p, DType dtype) {
  return column_bytes(p, dtype);
}

size_t deform_conv2d_backward_workspace_cuda(const DeformConv2dParams& p, DType dtype) {
  return column_bytes(p, dtype) + backward_extra_bytes(p, dtype);
}

size_t deform_conv2d_forward_workspace_cuda_bound(const DeformConv2dParams& max_params, DType dtype) {
  // Chunks hold min(batch, kCudaColumnBytes / per_image) images (at least one), so the columns of any
  // smaller problem take at most min(batch * per_image, max(per_image, kCudaColumnBytes)) bytes.
  const DeformConv2dParams& p = max_params;
  const int64_t per_image = std::max<int64_t>(
      1, p.in_channels * p.kernel_size() * p.out_spatial() * static_cast<int64_t>(dtype_size(dtype)));
  const int64_t all = std::max<int64_t>(1, p.batch) * per_image;
  return align_up(static_cast<size_t>(std::min<int64_t>(all, std::max<int64_t>(per_image, kCudaColumnBytes))));
}

Status deform_conv2d_forward_cuda(const DeformConv2dParams& p, DType dtype, const void* input,
                                  const void* offset, const void* weight, const void* bias,
                                  const void* mask, void* output, void* workspace,
                                  const CudaContext& ctx) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return forward_impl<T>(p, static_cast<const T*>(input), static_cast<const T*>(offset),
                           static_cast<const T*>(weight), static_cast<const T*>(bias),
                           static_cast<const T*>(mask), static_cast<T*>(output), workspace, ctx);
  });
}

Status deform_conv2d_backward_cuda(const DeformConv2dParams& p, DType dtype, const void* grad_output,
                                   const void* input, const void* offset, const void* weight,
                                   const void* mask, void* grad_input, void* grad_offset,
                                   void* grad_weight, void* grad_bias, void* grad_mask,
                                   void* workspace, const CudaContext& ctx) {
  return dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    return backward_impl<T>(p, static_cast<const T*>(grad_output), static_cast<const T*>(input),
                            static_cast<const T*>(offset), static_cast<const T*>(weight),
                            static_cast<const T*>(mask), static_cast<T*>(grad_input),
                            static_cast<T*>(grad_offset), static_cast<T*>(grad_weight),
                            static_cast<T*>(grad_bias), static_cast<T*>(grad_mask), workspace, ctx);
  });
}

}  // namespace dcnkit
