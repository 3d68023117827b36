// Autocast kernels of the forward ops (AutocastCPU and AutocastCUDA), as torchvision's: under torch.autocast every
// floating tensor argument except float64 is cast to float32, the op runs below autocast (through the dispatcher, so
// autograd records it in float32), and its results are returned in the dtype of its first tensor argument (the
// features: input, value, features[0]). The backward ops need none: autograd saved float32 tensors, and the kernels
// exclude autocast for everything they call. One boxed kernel for every op of the table.
#include <ATen/autocast_mode.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <torch/library.h>

#include <optional>
#include <vector>

#include "dcnkit/op_decl.h"

namespace dcnkit::torch_binding {
namespace {

template <c10::DeviceType D>
void autocast_kernel(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::autocast_dispatch_keyset);
  const size_t n = op.schema().arguments().size();
  std::optional<at::ScalarType> dtype;
  for (size_t i = stack->size() - n; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) {
      const at::Tensor t = v.toTensor();
      if (!dtype) dtype = t.scalar_type();
      v = at::autocast::cached_cast(at::kFloat, t, D);
    } else if (v.isTensorList()) {
      std::vector<at::Tensor> list;
      for (const at::Tensor& t : v.toTensorList()) {
        if (!dtype) dtype = t.scalar_type();
        list.push_back(at::autocast::cached_cast(at::kFloat, t, D));
      }
      v = c10::IValue(list);
    }
  }
  op.callBoxed(stack);
  if (!dtype) return;  // an empty list reaches the kernel's error
  const size_t outs = op.schema().returns().size();
  for (size_t i = stack->size() - outs; i < stack->size(); ++i) {
    c10::IValue& v = (*stack)[i];
    if (v.isTensor()) v = v.toTensor().to(*dtype);
  }
}

template <c10::DeviceType D>
void register_autocast(torch::Library& m) {
  for (const OpDecl* d : op_table()) {
    m.impl(d->def.name, torch::CppFunction::makeFromBoxedFunction<&autocast_kernel<D>>());
  }
}

}  // namespace
}  // namespace dcnkit::torch_binding

// Both keys are registered in every build: a CUDA tensor in a build without CUDA then reaches the kernel's "built
// without CUDA" error rather than a dtype error.
TORCH_LIBRARY_IMPL(dcnkit, AutocastCPU, m) { dcnkit::torch_binding::register_autocast<c10::DeviceType::CPU>(m); }
TORCH_LIBRARY_IMPL(dcnkit, AutocastCUDA, m) { dcnkit::torch_binding::register_autocast<c10::DeviceType::CUDA>(m); }
