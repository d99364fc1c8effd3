// A Comm over a torch.distributed backend object (c10d::Backend: the
// ProcessGroupGloo or ProcessGroupNCCL of a sub-group that the Python side
// created): ring steps are its send/recv, native steps its collectives, all
// called from C++ with no Python and no GIL. With device/torch_device.cc the
// only files that include torch's headers (they are slow to compile): the
// rest of hocc._C sees just this factory.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>

#include "transport/transport.h"

namespace hocc {

// Every call check on a CPU backend sends one frame of kFrameBytes: the
// CallId, then room for a tiny call's data. A collective whose gathered
// inputs fit that room (n members x their input <= kTinyBytes) runs as frames
// alone, the check folded into its data (c10d.cc, "tiny calls").
constexpr size_t kFrameBytes = 512;
constexpr size_t kTinyBytes = kFrameBytes - sizeof(CallId);

// `backend`: a Python torch.distributed backend object; this rank is member
// `me` of its `n`; `device`: where the buffers live ("cpu", "cuda:0", ...)
std::shared_ptr<Comm> make_c10d_comm(pybind11::handle backend, int me, int n, const std::string& device);

}  // namespace hocc
