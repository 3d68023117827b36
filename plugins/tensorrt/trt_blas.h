// One cuBLAS handle per TensorRT execution context, shared by every plugin instance attached to it.
//
// A plugin with a GEMM (DeformConv2d) takes a reference in attachToContext and drops it when TensorRT destroys
// the instance; the first reference creates the handle, the last destroys it. So N deformable layers in M
// contexts make M handles (not N x M), and the cublasDestroy that synchronises the device runs once per
// context teardown. enqueue binds the call's stream to the handle (cublas_gemm does, per GEMM). An instance that
// TensorRT enqueues without attaching it (timing during the build) acquires a handle on its first enqueue, keyed by
// the instance itself, and releases it when it is destroyed.
//
// The key is the IPluginResourceContext TensorRT passes to attachToContext: TensorRT guarantees a different
// one for each execution context. The context's GPU allocator is not a key of its own (one runtime's contexts
// share its allocator, and contexts may run concurrently on different threads), and the stream is not known
// before enqueue. Within one context TensorRT enqueues layers from one thread; layers on auxiliary streams
// share the handle through cuBLAS's default workspace pool, which keeps a workspace per stream.
#pragma once

#include "dcnkit/common.h"
#include "dcnkit/cublas_gemm.h"

namespace dcnkit::trt {

// The shared GEMM of execution context `key` (non-null), created on its first acquisition; null with the
// cuBLAS error in *s. Each successful call needs one release_context_gemm(key).
CublasGemm* acquire_context_gemm(const void* key, Status* s);
void release_context_gemm(const void* key);

}  // namespace dcnkit::trt
