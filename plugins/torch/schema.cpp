// The dcnkit torch operator schemas (namespace "dcnkit"), one op and one backward op per declaration of the op table
// (dcnkit/op_decl.h). Kernels: torch_ops.cpp; autocast: autocast.cpp; fake kernels and autograd are registered in
// Python next to each op's wrapper (python/dcnkit/ops/) through torch.library.
#include <torch/library.h>

#include "dcnkit/op_decl.h"

TORCH_LIBRARY(dcnkit, m) {
  for (const dcnkit::OpDecl* d : dcnkit::op_table()) {
    m.def(d->torch_schema);
    if (d->torch_backward_schema != nullptr) m.def(d->torch_backward_schema);
  }
}

namespace {
bool cuda_compiled() {
#ifdef DCNKIT_WITH_CUDA
  return true;
#else
  return false;
#endif
}
}  // namespace

TORCH_LIBRARY_FRAGMENT(dcnkit, m) { m.def("_cuda_compiled() -> bool", &cuda_compiled); }
