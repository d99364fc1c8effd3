// hocc._C: the C++ executor and its transports, for hocc/native/*.py.
// Buffers cross as integer addresses (tensor.data_ptr()); the Python side
// checks shapes, dtypes and devices before anything gets here.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/plan.h"
#include "core/types.h"
#include "device/device.h"
#include "executor/executor.h"
#include "kernels/reduce_cpu.h"
#include "transport/inproc.h"
#include "transport/shm.h"
#ifdef HOCC_WITH_CUDA
#include <cuda_runtime.h>

#include "device/cuda_device.h"
#include "kernels/reduce_cuda.h"
#include "transport/nccl.h"
#endif

namespace py = pybind11;
using namespace hocc;

namespace {

using GroupTuple = std::tuple<std::vector<int>, size_t, size_t>;
using StepTuple = std::tuple<int, int, std::string, std::string, std::vector<GroupTuple>>;

Plan make_plan(int world, int stages, int chunks, size_t work_elems, const std::vector<StepTuple>& steps) {
  Plan p;
  p.world = world, p.stages = stages, p.chunks = chunks, p.work_elems = work_elems;
  for (const auto& [stage, chunk, op, impl, groups] : steps) {
    Step s;
    s.stage = stage, s.chunk = chunk, s.op = parse_plan_op(op), s.impl = parse_impl(impl);
    for (const auto& [ranks, offset, seg] : groups) {
      for (int r : ranks)
        if (r < 0 || r >= world) throw Error("hocc: plan group names rank " + std::to_string(r) + " of " +
                                             std::to_string(world));
      s.groups.push_back({ranks, offset, seg});
    }
    p.steps.push_back(std::move(s));
  }
  return p;
}

void* ptr(uintptr_t a) { return reinterpret_cast<void*>(a); }

std::unique_ptr<Device> make_device(const std::string& name) {
  if (name == "cpu") return std::make_unique<CpuDevice>();
#ifdef HOCC_WITH_CUDA
  if (name.rfind("cuda", 0) == 0) {
    int index = name.size() > 5 ? std::stoi(name.substr(5)) : 0;
    return std::make_unique<CudaDevice>(index);
  }
#endif
  throw Error("hocc: device '" + name + "' is not available in this build of hocc._C (cuda built: " +
#ifdef HOCC_WITH_CUDA
              "yes"
#else
              "no"
#endif
              ")");
}

// An in-process world with one executor per rank; run() starts one thread per rank.
class InProcRunner {
 public:
  InProcRunner(int size, const std::string& device, double timeout_s)
      : device_(make_device(device)), world_(size, *device_, timeout_s) {
    for (int r = 0; r < size; ++r) execs_.push_back(std::make_unique<Executor>(world_.rank(r)));
  }

  // fail_rank >= 0 makes that rank fail before its first step (to test that peers do not hang)
  void run(const Plan& plan, const std::vector<uintptr_t>& bufs, const std::string& dtype, const std::string& op,
           int fail_rank) {
    if (int(bufs.size()) != world_.size())
      throw Error("hocc in-process: " + std::to_string(bufs.size()) + " buffers for " +
                  std::to_string(world_.size()) + " ranks");
    DType t = parse_dtype(dtype);
    RedOp o = parse_op(op);
    std::vector<std::string> errors(bufs.size());
    {
      py::gil_scoped_release nogil;
      world_.reset();
      std::vector<std::thread> threads;
      for (int r = 0; r < world_.size(); ++r)
        threads.emplace_back([&, r] {
          try {
            if (r == fail_rank) throw Error("rank " + std::to_string(r) + " failed on purpose");
            execs_[r]->run(plan, ptr(bufs[r]), t, o, nullptr);
          } catch (const std::exception& e) {
            errors[r] = e.what();
            world_.abort(e.what());
          }
        });
      for (auto& th : threads) th.join();
    }
    std::string first;
    for (size_t r = 0; r < errors.size(); ++r)
      if (!errors[r].empty() && (first.empty() || errors[r].find("a peer failed") == std::string::npos)) {
        first = "rank " + std::to_string(r) + ": " + errors[r];
        if (errors[r].find("a peer failed") == std::string::npos) break;
      }
    if (!first.empty()) throw Error(first);
  }

 private:
  std::unique_ptr<Device> device_;
  InProcWorld world_;
  std::vector<std::unique_ptr<Executor>> execs_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hocc's C++ executor: plans run over in-process, shared-memory and NCCL transports";
  py::register_exception<Error>(m, "HoccNativeError", PyExc_RuntimeError);

  m.def("cuda_built", [] {
#ifdef HOCC_WITH_CUDA
    return true;
#else
    return false;
#endif
  }, "True when this build has the CUDA kernels and the NCCL transport");

  py::class_<Plan>(m, "Plan")
      .def(py::init(&make_plan), py::arg("world"), py::arg("stages"), py::arg("chunks"), py::arg("work_elems"),
           py::arg("steps"))
      .def_readonly("world", &Plan::world)
      .def_readonly("stages", &Plan::stages)
      .def_readonly("chunks", &Plan::chunks)
      .def_property_readonly("num_steps", [](const Plan& p) { return p.steps.size(); });

  m.def("reduce", [](uintptr_t dst, uintptr_t src, size_t n, const std::string& dtype, const std::string& op) {
    DType t = parse_dtype(dtype);
    RedOp o = op == "copy" ? RedOp::none : parse_op(op);
    py::gil_scoped_release nogil;
    reduce_cpu(ptr(dst), ptr(src), n, t, o);
  }, "dst = dst (op) src on host memory", py::arg("dst"), py::arg("src"), py::arg("n"), py::arg("dtype"),
        py::arg("op"));
  m.def("reduce_many", [](uintptr_t dst, const std::vector<uintptr_t>& srcs, size_t n, const std::string& dtype,
                          const std::string& op) {
    std::vector<const void*> s;
    for (auto a : srcs) s.push_back(ptr(a));
    DType t = parse_dtype(dtype);
    RedOp o = parse_op(op);
    py::gil_scoped_release nogil;
    reduce_cpu_many(ptr(dst), s.data(), int(s.size()), n, t, o);
  }, "dst = srcs[0] (op) srcs[1] ... on host memory");

  py::class_<InProcRunner>(m, "InProcWorld")
      .def(py::init<int, const std::string&, double>(), py::arg("size"), py::arg("device") = "cpu",
           py::arg("timeout_s") = 60.0)
      .def("run", &InProcRunner::run, py::arg("plan"), py::arg("buffers"), py::arg("dtype"), py::arg("op"),
           py::arg("fail_rank") = -1);

  py::class_<ShmComm>(m, "ShmComm", "one host group's shared-memory segment (see csrc/transport/shm.h)")
      .def(py::init([](const std::string& path, int me, int n, size_t half_bytes, double timeout_s,
                       const std::string& wait) {
             return std::make_unique<ShmComm>(path, me, n, half_bytes, timeout_s, parse_wait_mode(wait));
           }),
           py::arg("path"), py::arg("me"), py::arg("n"), py::arg("half_bytes"), py::arg("timeout_s"),
           py::arg("wait") = "futex")
      .def_static("segment_bytes", &ShmComm::segment_bytes)
      .def("all_reduce", [](ShmComm& c, uintptr_t buf, size_t count, const std::string& dtype, const std::string& op,
                            uintptr_t src) {
        DType t = parse_dtype(dtype);
        RedOp o = parse_op(op);
        py::gil_scoped_release nogil;
        c.all_reduce_from(static_cast<const char*>(ptr(src ? src : buf)), static_cast<char*>(ptr(buf)), count, t, o);
      }, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("src") = 0,
      "in place on buf, or reading the input from src")
      .def("reduce_scatter", [](ShmComm& c, uintptr_t buf, size_t seg, const std::string& dtype,
                                const std::string& op) {
        DType t = parse_dtype(dtype);
        RedOp o = parse_op(op);
        py::gil_scoped_release nogil;
        c.reduce_scatter(static_cast<char*>(ptr(buf)), seg, t, o, Lane{});
      })
      .def("all_gather", [](ShmComm& c, uintptr_t buf, size_t seg, const std::string& dtype) {
        DType t = parse_dtype(dtype);
        py::gil_scoped_release nogil;
        c.all_gather(static_cast<char*>(ptr(buf)), seg, t, Lane{});
      })
      .def_property_readonly("broken", &ShmComm::broken)
      .def_property_readonly("barriers", &ShmComm::barriers)
      .def_property_readonly("wait_seconds", &ShmComm::wait_seconds);

#ifdef HOCC_WITH_CUDA
  m.def("nccl_version", &nccl_version);
  py::class_<NcclTransport>(m, "NcclTransport")
      .def_static("unique_id", [] { return py::bytes(NcclTransport::unique_id()); })
      .def(py::init([](py::bytes id, int rank, int size, int device) {
             std::string s = id;
             py::gil_scoped_release nogil;
             return std::make_unique<NcclTransport>(s, rank, size, device);
           }),
           py::arg("unique_id"), py::arg("rank"), py::arg("size"), py::arg("device"))
      .def("all_reduce", [](NcclTransport& t, uintptr_t buf, size_t n, const std::string& dtype,
                            const std::string& op, uintptr_t stream) {
        t.world().all_reduce(static_cast<char*>(ptr(buf)), n, parse_dtype(dtype), parse_op(op), Lane{ptr(stream)});
      }, "all-reduce over the whole group, in place, on `stream`");
  py::class_<Executor>(m, "NcclExecutor")
      .def(py::init([](NcclTransport& t) { return std::make_unique<Executor>(t); }), py::keep_alive<1, 2>())
      .def("run", [](Executor& e, const Plan& plan, uintptr_t work, const std::string& dtype, const std::string& op,
                     uintptr_t stream) {
        DType t = parse_dtype(dtype);
        RedOp o = parse_op(op);
        py::gil_scoped_release nogil;
        e.run(plan, ptr(work), t, o, ptr(stream));
      }, py::arg("plan"), py::arg("work"), py::arg("dtype"), py::arg("op"), py::arg("stream"));
  m.def("bench_reduce_cuda", [](size_t bytes, const std::string& dtype, int iters, int device) {
    if (cudaSetDevice(device) != cudaSuccess) throw Error("hocc: no CUDA device " + std::to_string(device));
    auto bw = bench_reduce_cuda(bytes, parse_dtype(dtype), iters);
    return std::make_pair(bw.reduce_gbps, bw.copy_gbps);
  }, "(reduce GB/s, copy GB/s) over buffers of `bytes`", py::arg("bytes"), py::arg("dtype") = "float32",
        py::arg("iters") = 20, py::arg("device") = 0);
#endif
}
