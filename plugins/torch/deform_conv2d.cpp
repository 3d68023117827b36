// PyTorch kernels of dcnkit::deform_conv2d and dcnkit::_deform_conv2d_backward (schemas in schema.cpp):
// one function per op, registered for CPU and CUDA, dispatching to the core launchers by device
// (run_on_device). Fake kernels and autograd are registered in Python (python/dcnkit/ops/deform_conv.py).
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <tuple>

#include "dcnkit/deform_conv2d.h"
#include "torch_common.h"

namespace dcnkit::torch_binding {

namespace {

constexpr const char* kOp = "deform_conv2d";
constexpr const char* kBackwardOp = "_deform_conv2d_backward";

// ---- CPU GEMM straight through the BLAS that libtorch_cpu exports (Fortran sgemm_/dgemm_) --------
// The tiled forward issues one small GEMM per tile; wrapping pointers in tensors for every call costs
// more than the GEMM itself on small tiles. When the symbols are absent, ATen's GEMM is used.
using FortranSgemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                              const float*, const float*, const int*, const float*, const int*,
                              const float*, float*, const int*);
using FortranDgemm = void (*)(const char*, const char*, const int*, const int*, const int*,
                              const double*, const double*, const int*, const double*, const int*,
                              const double*, double*, const int*);

using SetLocalThreads = int (*)(int);

struct Blas {
  FortranSgemm sgemm = nullptr;
  FortranDgemm dgemm = nullptr;
  // MKL's thread-local thread count: GEMMs from inside parallel tasks must not start nested threads.
  SetLocalThreads set_local_threads = nullptr;
};

const Blas& blas() {
  static const Blas b = [] {
    Blas r;
    if (std::getenv("DCNKIT_NO_DIRECT_BLAS") != nullptr) return r;
    void* h = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    if (h == nullptr) return r;
    r.sgemm = reinterpret_cast<FortranSgemm>(dlsym(h, "sgemm_"));
    r.dgemm = reinterpret_cast<FortranDgemm>(dlsym(h, "dgemm_"));
    r.set_local_threads = reinterpret_cast<SetLocalThreads>(dlsym(h, "MKL_Set_Num_Threads_Local"));
    return r;
  }();
  return b;
}

bool fits_int(int64_t v) { return v >= 0 && v <= 0x7fffffff; }

Status blas_gemm(void* aten_self, const GemmArgs& g) {
  const Blas& b = blas();
  const bool f32 = g.dtype == DType::kFloat32 && b.sgemm;
  const bool f64 = g.dtype == DType::kFloat64 && b.dgemm;
  const bool ints = fits_int(g.m) && fits_int(g.n) && fits_int(g.k) && fits_int(g.lda) &&
                    fits_int(g.ldb) && fits_int(g.ldc);
  if (!(f32 || f64) || !ints || g.m == 0 || g.n == 0 || g.k == 0) return aten_gemm(aten_self, g);
  // Row-major C = op(A) op(B)  <=>  column-major C^T = op(B)^T op(A)^T.
  const char ta = g.trans_b ? 'T' : 'N', tb = g.trans_a ? 'T' : 'N';
  const int m = static_cast<int>(g.n), n = static_cast<int>(g.m), k = static_cast<int>(g.k);
  const int lda = static_cast<int>(std::max<int64_t>(1, g.ldb));
  const int ldb = static_cast<int>(std::max<int64_t>(1, g.lda));
  const int ldc = static_cast<int>(std::max<int64_t>(1, g.ldc));
  // The core calls this GEMM from inside parallel tasks (CpuContext: "single-threaded GEMM").
  const int previous = b.set_local_threads ? b.set_local_threads(1) : 0;
  for (int64_t i = 0; i < g.batch; ++i) {
    if (f32) {
      const float alpha = g.alpha, beta = g.beta;
      b.sgemm(&ta, &tb, &m, &n, &k, &alpha, static_cast<const float*>(g.b) + i * g.stride_b, &lda,
              static_cast<const float*>(g.a) + i * g.stride_a, &ldb, &beta,
              static_cast<float*>(g.c) + i * g.stride_c, &ldc);
    } else {
      const double alpha = g.alpha, beta = g.beta;
      b.dgemm(&ta, &tb, &m, &n, &k, &alpha, static_cast<const double*>(g.b) + i * g.stride_b, &lda,
              static_cast<const double*>(g.a) + i * g.stride_a, &ldb, &beta,
              static_cast<double*>(g.c) + i * g.stride_c, &ldc);
    }
  }
  if (b.set_local_threads) b.set_local_threads(previous);
  return Status::Ok();
}

CpuContext fast_cpu_context() {
  CpuContext ctx = cpu_context();  // gemm_self stays ATen's options, for the fallback
  ctx.gemm = &blas_gemm;
  return ctx;
}

// ---- shared checks -------------------------------------------------------------------------------

struct Prepared {
  DeformConv2dParams p;
  at::Tensor input, offset, weight, bias, mask;
};

// Device and dtype of every tensor (each on input's device with input's dtype).
void check_devices_and_dtypes(const char* op, const at::Tensor& input, const at::Tensor& offset,
                              const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& mask, bool backward) {
  TORCH_CHECK_VALUE(input.device().is_cpu() || input.device().is_cuda(), op,
                    ": input: expected a CPU or CUDA tensor, got ", input.device());
  const at::Tensor b = bias.has_value() ? *bias : at::Tensor();
  const at::Tensor m = mask.has_value() ? *mask : at::Tensor();
  check_inputs(op, input, backward, {{"offset", &offset}, {"weight", &weight}, {"bias", &b}, {"mask", &m}});
}

Prepared prepare(const char* op, const at::Tensor& input, const at::Tensor& offset,
                 const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                 const std::optional<at::Tensor>& mask, int64_t stride_h, int64_t stride_w,
                 int64_t pad_h, int64_t pad_w, int64_t dilation_h, int64_t dilation_w,
                 int64_t groups, int64_t deformable_groups, bool backward) {
  check_devices_and_dtypes(op, input, offset, weight, bias, mask, backward);
  const bool has_bias = bias.has_value() && bias->defined();
  const bool has_mask = mask.has_value() && mask->defined();

  DeformConv2dAttrs a;
  a.stride_h = stride_h;
  a.stride_w = stride_w;
  a.pad_h = pad_h;
  a.pad_w = pad_w;
  a.dilation_h = dilation_h;
  a.dilation_w = dilation_w;
  a.groups = groups;
  a.deformable_groups = deformable_groups;
  Prepared r;
  const Shape bias_shape = has_bias ? shape_of(*bias) : Shape{};
  const Shape mask_shape = has_mask ? shape_of(*mask) : Shape{};
  throw_if_error(make_deform_conv2d_params(op, shape_of(input), shape_of(offset), shape_of(weight),
                                           has_bias ? &bias_shape : nullptr,
                                           has_mask ? &mask_shape : nullptr, a, &r.p));
  r.input = input.contiguous();
  r.offset = offset.contiguous();
  r.weight = weight.contiguous();
  r.bias = has_bias ? bias->contiguous() : at::Tensor();
  r.mask = has_mask ? mask->contiguous() : at::Tensor();
  return r;
}

// ---- ops -----------------------------------------------------------------------------------------

at::Tensor deform_conv2d_forward(const at::Tensor& input, const at::Tensor& offset,
                                 const at::Tensor& weight, const std::optional<at::Tensor>& bias,
                                 const std::optional<at::Tensor>& mask, int64_t stride_h,
                                 int64_t stride_w, int64_t pad_h, int64_t pad_w, int64_t dilation_h,
                                 int64_t dilation_w, int64_t groups, int64_t deformable_groups) {
  if (computes_in_float32(input)) {
    check_devices_and_dtypes(kOp, input, offset, weight, bias, mask, /*backward=*/false);
    return deform_conv2d_forward(to_float32(input), to_float32(offset), to_float32(weight),
                                 to_float32(bias), to_float32(mask), stride_h, stride_w, pad_h, pad_w,
                                 dilation_h, dilation_w, groups, deformable_groups)
        .to(input.scalar_type());
  }
  Prepared r = prepare(kOp, input, offset, weight, bias, mask, stride_h, stride_w, pad_h, pad_w,
                       dilation_h, dilation_w, groups, deformable_groups, /*backward=*/false);
  const DeformConv2dParams& p = r.p;
  at::Tensor output = at::empty(p.output_shape(), r.input.options());
  if (output.numel() == 0) return output;
  const DType dt = dtype_of(r.input);
  run_on_device(
      kOp, r.input,
      [&](auto zero) {
        using T = decltype(zero);
        const CpuContext ctx = fast_cpu_context();
        at::Tensor ws = workspace_for(r.input, deform_conv2d_forward_workspace_cpu(p, dt, ctx));
        return deform_conv2d_forward_cpu<T>(
            p, r.input.const_data_ptr<T>(), r.offset.const_data_ptr<T>(), r.weight.const_data_ptr<T>(),
            ptr_or_null<T>(r.bias), ptr_or_null<T>(r.mask), output.mutable_data_ptr<T>(),
            ws.mutable_data_ptr(), ctx);
      },
      [&](const CudaContext& ctx) {
        at::Tensor ws = workspace_for(r.input, deform_conv2d_forward_workspace_cuda(p, dt));
        return deform_conv2d_forward_cuda(p, dt, r.input.const_data_ptr(), r.offset.const_data_ptr(),
                                          r.weight.const_data_ptr(), vptr_or_null(r.bias),
                                          vptr_or_null(r.mask), output.mutable_data_ptr(),
                                          ws.mutable_data_ptr(), ctx);
      });
  return output;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> deform_conv2d_backward(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& offset,
    const at::Tensor& weight, const std::optional<at::Tensor>& bias,
    const std::optional<at::Tensor>& mask, int64_t stride_h, int64_t stride_w, int64_t pad_h,
    int64_t pad_w, int64_t dilation_h, int64_t dilation_w, int64_t groups,
    int64_t deformable_groups) {
  // No alert_atomic_cuda_backward: under torch.use_deterministic_algorithms the CUDA backward takes its
  // atomic-free path (cuda_context sets CudaContext::deterministic; deform_conv2d_sorted.h).
  if (computes_in_float32(input)) {
    check_devices_and_dtypes(kBackwardOp, input, offset, weight, bias, mask, /*backward=*/true);
    check_tensor(kBackwardOp, "grad_output", grad_output, input);
    auto [gi, go, gw, gb, gm] = deform_conv2d_backward(
        to_float32(grad_output), to_float32(input), to_float32(offset), to_float32(weight),
        to_float32(bias), to_float32(mask), stride_h, stride_w, pad_h, pad_w, dilation_h, dilation_w,
        groups, deformable_groups);
    const auto st = input.scalar_type();
    return {gi.to(st), go.to(st), gw.to(st), gb.to(st), gm.to(st)};
  }
  Prepared r = prepare(kBackwardOp, input, offset, weight, bias, mask, stride_h, stride_w, pad_h,
                       pad_w, dilation_h, dilation_w, groups, deformable_groups, /*backward=*/true);
  const DeformConv2dParams& p = r.p;
  check_tensor(kBackwardOp, "grad_output", grad_output, input);
  const Shape expected = p.output_shape();
  TORCH_CHECK_VALUE(shape_of(grad_output) == expected, kBackwardOp, ": grad_output: expected shape ",
                    shape_str(expected), " (the output shape), got ", shape_str(shape_of(grad_output)));
  const at::Tensor gout = grad_output.contiguous();

  at::Tensor grad_input = at::empty_like(r.input);
  at::Tensor grad_offset = at::zeros_like(r.offset);
  at::Tensor grad_weight = at::empty_like(r.weight);
  at::Tensor grad_bias = r.bias.defined() ? at::empty_like(r.bias) : at::empty({0}, r.input.options());
  at::Tensor grad_mask = r.mask.defined() ? at::zeros_like(r.mask) : at::empty({0}, r.input.options());
  const DType dt = dtype_of(r.input);
  run_on_device(
      kBackwardOp, r.input,
      [&](auto zero) {
        using T = decltype(zero);
        const CpuContext ctx = fast_cpu_context();
        at::Tensor ws = workspace_for(r.input, deform_conv2d_backward_workspace_cpu(p, dt, ctx));
        return deform_conv2d_backward_cpu<T>(
            p, gout.const_data_ptr<T>(), r.input.const_data_ptr<T>(), r.offset.const_data_ptr<T>(),
            r.weight.const_data_ptr<T>(), ptr_or_null<T>(r.mask), grad_input.mutable_data_ptr<T>(),
            grad_offset.mutable_data_ptr<T>(), grad_weight.mutable_data_ptr<T>(),
            mut_ptr_or_null<T>(r.bias.defined() ? grad_bias : at::Tensor()),
            mut_ptr_or_null<T>(r.mask.defined() ? grad_mask : at::Tensor()), ws.mutable_data_ptr(),
            ctx);
      },
      [&](const CudaContext& ctx) {
        at::Tensor ws = workspace_for(r.input, deform_conv2d_backward_workspace_cuda(p, dt, ctx.deterministic));
        return deform_conv2d_backward_cuda(
            p, dt, gout.const_data_ptr(), r.input.const_data_ptr(), r.offset.const_data_ptr(),
            r.weight.const_data_ptr(), vptr_or_null(r.mask), grad_input.mutable_data_ptr(),
            grad_offset.mutable_data_ptr(), grad_weight.mutable_data_ptr(),
            r.bias.defined() ? grad_bias.mutable_data_ptr() : nullptr,
            r.mask.defined() ? grad_mask.mutable_data_ptr() : nullptr, ws.mutable_data_ptr(), ctx);
      });
  return {grad_input, grad_offset, grad_weight, grad_bias, grad_mask};
}

void register_deform_conv2d(torch::Library& m) {
  m.impl("deform_conv2d", &deform_conv2d_forward);
  m.impl("_deform_conv2d_backward", &deform_conv2d_backward);
}

}  // namespace
}  // namespace dcnkit::torch_binding

DCNKIT_TORCH_IMPL_CPU_CUDA(dcnkit::torch_binding::register_deform_conv2d)
