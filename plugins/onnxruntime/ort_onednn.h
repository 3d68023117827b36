// oneDNN's int8 GEMM (dnnl_gemm_u8s8s32, the stable C API of dnnl.h in oneDNN 2.x and 3.x) for the quantized
// kernels, loaded at first use (dlopen): the library has no link dependency on oneDNN, so it loads, and every
// float op runs, where oneDNN is absent. Where it is looked for, in order:
//   1. $DCNKIT_ONEDNN_LIB (a path to libdnnl.so.*), and nothing else when it is set;
//   2. the copy scripts/onednn_fetch.sh unpacks into the source tree's .deps/onednn/lib (builds from a checkout);
//   3. the system's libdnnl.so.3, then libdnnl.so.2 (Debian/Ubuntu: apt install libdnnl2 or libdnnl3).
#pragma once

#include "dcnkit/deform_conv2d_quant.h"

namespace dcnkit::ort {

// The GEMM as a QGemmFn (self unused), or an error naming what was tried and how to provide oneDNN.
Status onednn_gemm_u8s8s32(QGemmFn* fn);

}  // namespace dcnkit::ort
