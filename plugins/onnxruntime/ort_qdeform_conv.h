// dcnkit::QDeformConv2d (ort_qdeform_conv.cpp): its custom ops (uint8 and int8), added to the "dcnkit" domain by
// register_all.
#pragma once

#include <vector>

#include "ort_common.h"

namespace dcnkit::ort {

const std::vector<OrtCustomOp*>& qdeform_conv_ops();

}  // namespace dcnkit::ort
