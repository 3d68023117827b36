// The CPU work of a kit operation: its inputs by canonical index, the op's declaration (shapes checked, its
// forward_cpu entry point) over OpenVINO's threads (the TBB arena of the inference stream that runs the node) and
// OpenBLAS.
#pragma once

#include <vector>

#include "dcnkit/common.h"
#include "dcnkit/context.h"
#include "openvino/runtime/tensor.hpp"

namespace dcnkit::ov_ext {

class KitOpBase;

// The output shapes of `op` for its inputs' shapes (in the node's input order), checked by its declaration.
Status output_shapes(const KitOpBase& op, const std::vector<Shape>& inputs, std::vector<Shape>* out);

// The floating types a kit operation accepts: float32, and float16 / bfloat16 (converted to float32 and back around
// the kernel) where OpenVINO's inference precision hints have converted the graph around the node, or float64 (a
// float64 model; OpenVINO's CPU plugin computes it in float32 too).
bool is_kernel_float_type(const ov::element::Type& t);

// Computes `op`'s outputs (shaped here) from `inputs`.
Status run_cpu(const KitOpBase& op, ov::TensorVector& outputs, const ov::TensorVector& inputs);

// NaN in every element of the floating outputs that have memory: what a failed run leaves there. OpenVINO 2026.4's CPU
// plugin, run with one inference thread, loses an extension operation's exception in its synchronous infer() (its
// asynchronous start_async() + wait() raises it): the caller then reads NaN, not uninitialised memory.
void poison_outputs(ov::TensorVector& outputs);

// The CPU context of a run: OpenVINO's TBB arena (its concurrency) and OpenBLAS, single-threaded per task.
CpuContext cpu_context();

}  // namespace dcnkit::ov_ext
