// oneDNN's int8 GEMM (dnnl_gemm_u8s8s32, the stable C API of dnnl.h in oneDNN 2.x and 3.x) for the quantized
// kernels, from the process's oneDNN, loaded at first use (dcnkit/onednn_lib.h says where it is looked for): the
// library has no link dependency on oneDNN, so it loads, and every float op runs, where oneDNN is absent.
#pragma once

#include "dcnkit/deform_conv2d_quant.h"

namespace dcnkit::ort {

// The GEMM as a QGemmFn (self unused), or an error naming what was tried and how to provide oneDNN.
Status onednn_gemm_u8s8s32(QGemmFn* fn);

}  // namespace dcnkit::ort
