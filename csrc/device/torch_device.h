// hocc's buffers as torch tensors, for the two files that talk to torch:
// device/torch_device.cc (the GPU's device layer) and transport/c10d.cc.
// torch's headers are slow to compile: nothing else includes this.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>

#include "core/types.h"

namespace hocc {

c10::ScalarType scalar_type(DType t);
// `count` elements at `p` on `device` as a 1-d tensor that does not own them
at::Tensor view(const void* p, size_t count, DType t, c10::Device device);

}  // namespace hocc
