// Moves data between the caller's buffers and a plan's work buffer
// ([chunks][blocks][piece], see core/plan.h and hocc/plan/types.py), with the
// device's own copies (no torch, no thread pools). Packing reads the caller's
// input; unpacking writes the caller's output, only after every step ended.
#pragma once

#include "core/plan.h"
#include "device/device.h"

namespace hocc {

// rank: this rank's position in the plan's group; es: bytes per element
void pack(const Plan& p, int rank, const char* input, char* work, size_t es, Device& dev, void* stream);
void unpack(const Plan& p, int rank, const char* work, char* output, size_t es, Device& dev, void* stream);

}  // namespace hocc
