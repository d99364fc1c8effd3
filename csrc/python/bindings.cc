// hocc._C: the C++ executor and its transports, for hocc/native/*.py and
// hocc/engine/*.py (typed in hocc/_C.pyi). Buffers cross as integer addresses
// (tensor.data_ptr()); the Python side checks shapes, dtypes and devices
// before anything gets here. Built against torch's copy of pybind11, so that
// transport/c10d.cc can take torch.distributed backend objects.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "core/call.h"
#include "core/plan.h"
#include "core/types.h"
#include "device/device.h"
#include "executor/executor.h"
#include "kernels/reduce_cpu.h"
#include "python/common.h"
#include "transport/c10d.h"
#include "transport/group.h"
#include "transport/inproc.h"
#include "transport/shm.h"
#include "transport/ucx.h"

namespace py = pybind11;
using namespace hocc;

namespace {

// hocc._C.HoccNativeError and HoccMismatchError, made at import and kept for the process (never freed:
// a failure may be raised on a worker thread up to the interpreter's end)
PyObject* native_error_type = nullptr;
PyObject* mismatch_error_type = nullptr;

py::object error_object(PyObject* type, const char* what, const Error* e) {
  py::object exc = py::reinterpret_borrow<py::object>(type)(what);
  const Where at = e ? e->where : Where{};
  exc.attr("stage") = at.stage;
  exc.attr("chunk") = at.chunk;
  exc.attr("step") = at.step;
  exc.attr("ranks") = py::tuple(py::cast(at.ranks));
  exc.attr("tier") = at.tier;
  exc.attr("where") = at.stage < 0 ? std::string() : at.text();
  exc.attr("cause") = e && !e->cause.empty() ? e->cause : std::string(what);
  return exc;
}

}  // namespace

py::object python_error(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const PythonFailure& e) {
    return *e.exc;
  } catch (const MismatchError& e) {
    return error_object(mismatch_error_type, e.what(), &e);
  } catch (const Error& e) {
    return error_object(native_error_type, e.what(), &e);
  } catch (const std::exception& e) {
    return error_object(native_error_type, e.what(), nullptr);
  } catch (...) {
    return error_object(native_error_type, "hocc: an unknown C++ exception", nullptr);
  }
}

namespace {

// the devices of direct calls from Python (Comm's collectives, reduce), one per name for the life of the
// process: a comm's scratch lives on the device it was first used with
Device& device_named(const std::string& name) {
  static std::mutex mu;
  static std::map<std::string, std::unique_ptr<Device>> devices;
  std::lock_guard<std::mutex> lk(mu);
  auto& d = devices[name];
  if (!d) d = make_device(name);
  return *d;
}

// SIGUSR1 -> a byte on a pipe, read by hocc/record/dump.py's thread, which
// dumps the recorders: a Python handler would wait for the main thread, which
// may be blocked in a call. Only write() and getpid(): async-signal-safe. A
// forked child keeps the handler but not the reader, so it ignores the signal
// until it installs its own.
int g_dump_fd = -1;
pid_t g_dump_pid = 0;

void on_dump_signal(int) {
  const int saved = errno;
  if (g_dump_fd >= 0 && getpid() == g_dump_pid) {
    const char b = 1;
    [[maybe_unused]] ssize_t n = write(g_dump_fd, &b, 1);
  }
  errno = saved;
}

void install_dump_signal(int fd, int signum) {
  g_dump_fd = fd;
  g_dump_pid = getpid();
  struct sigaction sa {};
  sa.sa_handler = on_dump_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(signum, &sa, nullptr) != 0) throw Error("hocc: could not install the recorder's signal handler");
}

// An in-process world with one executor per rank; run() starts one thread per rank.
class InProcRunner {
 public:
  InProcRunner(int size, const std::string& device, double timeout_s)
      : device_(make_device(device)), world_(size, *device_, timeout_s) {
    for (int r = 0; r < size; ++r) {
      execs_.push_back(std::make_unique<Executor>(world_.rank(r)));
      execs_.back()->set_record(1);  // last_record(rank): the latest run's
    }
  }

  // one collective: rank r reads inputs[r], writes outputs[r], works in works[r];
  // fail_rank >= 0 makes that rank fail before its first step, absent_rank >= 0 makes it never
  // join, slow_rank >= 0 makes it begin the run, then sleep slow_s before its first step (to test
  // that peers do not hang, and whom they name)
  void run(const Plan& plan, const std::vector<uintptr_t>& inputs, const std::vector<uintptr_t>& outputs,
           const std::vector<uintptr_t>& works, const std::string& dtype, const std::string& op, int fail_rank,
           int absent_rank, int slow_rank, double slow_s) {
    if (int(inputs.size()) != world_.size() || outputs.size() != inputs.size() || works.size() != inputs.size())
      throw Error("hocc in-process: need " + std::to_string(world_.size()) + " inputs, outputs and work buffers");
    DType t = parse_dtype(dtype);
    RedOp o = parse_op(op);
    const bool average = op == "avg";
    std::vector<std::string> errors(inputs.size());
    {
      py::gil_scoped_release nogil;
      world_.reset();
      std::vector<std::thread> threads;
      for (int r = 0; r < world_.size(); ++r)
        if (r != absent_rank) threads.emplace_back([&, r] {
          try {
            if (r == fail_rank) throw Error("rank " + std::to_string(r) + " failed on purpose");
            if (r == slow_rank) {
              world_.enter(r);
              std::this_thread::sleep_for(std::chrono::duration<double>(slow_s));
            }
            execs_[r]->run(plan, {ptr(inputs[r]), ptr(outputs[r]), ptr(works[r])}, t, o, average, nullptr);
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

  std::shared_ptr<RunRecord> last_record(int rank) const {
    if (rank < 0 || rank >= int(execs_.size())) throw Error("hocc in-process: no rank " + std::to_string(rank));
    return execs_[size_t(rank)]->last_record();
  }

 private:
  std::unique_ptr<Device> device_;
  InProcWorld world_;
  std::vector<std::unique_ptr<Executor>> execs_;
};

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "hocc's C++ executor: plans run over in-process, shared-memory and c10d (gloo, NCCL) transports";
  native_error_type = py::exception<Error>(m, "HoccNativeError", PyExc_RuntimeError).release().ptr();
  mismatch_error_type = py::exception<MismatchError>(m, "HoccMismatchError", native_error_type).release().ptr();
  // hocc::Error, its fields as attributes; a PythonFailure, the exception it carries
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      std::rethrow_exception(p);
    } catch (const PythonFailure&) {
      py::object exc = python_error(p);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    } catch (const Error&) {
      py::object exc = python_error(p);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(exc.ptr())), exc.ptr());
    }
  });

  m.def("install_dump_signal", &install_dump_signal, py::arg("fd"), py::arg("signum"),
        "on signum, write a byte to fd (hocc/record/dump.py reads it and dumps the recorders)");

  py::class_<Plan>(m, "Plan")
      .def(py::init([](const std::string& text) { return plan_from_json(text); }), py::arg("json"),
           "a plan from hocc.plan.types.Plan.to_json's text")
      .def_readonly("world", &Plan::world)
      .def_readonly("stages", &Plan::stages)
      .def_property_readonly("chunks", &Plan::chunks)
      .def_property_readonly("work_elems", [](const Plan& p) { return p.layout.size(); })
      .def_property_readonly("num_steps", [](const Plan& p) { return p.steps().size(); })
      .def_readonly("scale", &Plan::scale)
      .def("scaled", [](const Plan& p, size_t factor, size_t block_elems, const std::string& work_at, bool pack) {
        return p.scaled(factor, block_elems, parse_work_at(work_at), pack);
      }, py::arg("factor"), py::arg("block_elems"), py::arg("work_at"), py::arg("pack"));

  // a comm's collectives called directly (tests, microbenchmarks, the GPU check): on `device`'s current
  // stream, in place on buf (all_reduce may read its input from src)
  py::class_<Comm, std::shared_ptr<Comm>>(m, "Comm", "one group's communicator, for a GroupTransport")
      .def_readonly("me", &Comm::me)
      .def_readonly("n", &Comm::n)
      .def("all_reduce", [](Comm& c, uintptr_t buf, size_t count, const std::string& dtype, const std::string& op,
                            uintptr_t src, const std::string& device) {
        DType t = parse_dtype(dtype);
        RedOp o = parse_op(op);
        Device& dev = device_named(device);
        py::gil_scoped_release nogil;
        c.all_reduce(static_cast<const char*>(ptr(src ? src : buf)), static_cast<char*>(ptr(buf)), count, t, o,
                     Lane{nullptr, &dev});
        dev.sync(nullptr);
      }, py::arg("buf"), py::arg("count"), py::arg("dtype"), py::arg("op"), py::arg("src") = 0,
      py::arg("device") = "cpu", "in place on buf, or reading the input from src")
      .def("reduce_scatter", [](Comm& c, uintptr_t buf, size_t seg, const std::string& dtype, const std::string& op,
                                const std::string& device) {
        DType t = parse_dtype(dtype);
        RedOp o = parse_op(op);
        Device& dev = device_named(device);
        py::gil_scoped_release nogil;
        c.reduce_scatter(static_cast<char*>(ptr(buf)), static_cast<char*>(ptr(buf)), seg, t, o,
                         Lane{nullptr, &dev});
        dev.sync(nullptr);
      }, py::arg("buf"), py::arg("seg"), py::arg("dtype"), py::arg("op"), py::arg("device") = "cpu")
      .def("exchange", [](Comm& c, uintptr_t send, size_t send_n, uintptr_t recv, size_t recv_n,
                          const std::string& dtype, const std::string& op) {
        DType t = parse_dtype(dtype);
        RedOp o = op == "none" ? RedOp::none : parse_op(op);
        py::gil_scoped_release nogil;
        c.exchange(static_cast<const char*>(ptr(send)), send_n, static_cast<char*>(ptr(recv)), recv_n, t, o,
                   Lane{nullptr, &device_named("cpu")});
      }, py::arg("send"), py::arg("send_n"), py::arg("recv"), py::arg("recv_n"), py::arg("dtype"),
      py::arg("op") = "none", "one ring step on CPU buffers: send to member me+1, receive from me-1")
      .def("all_gather", [](Comm& c, uintptr_t buf, size_t seg, const std::string& dtype, const std::string& device) {
        DType t = parse_dtype(dtype);
        char* b = static_cast<char*>(ptr(buf));
        Device& dev = device_named(device);
        py::gil_scoped_release nogil;
        c.all_gather(b + size_t(c.me) * seg * dtype_size(t), b, seg, t, Lane{nullptr, &dev});
        dev.sync(nullptr);
      }, py::arg("buf"), py::arg("seg"), py::arg("dtype"), py::arg("device") = "cpu");
  m.def("c10d_comm", &make_c10d_comm, py::arg("backend"), py::arg("me"), py::arg("n"), py::arg("device") = "cpu",
        "a Comm over a torch.distributed backend object (ProcessGroupGloo, ProcessGroupNCCL) on `device`");
  // a CPU collective whose members' inputs together fit this runs as call-check frames alone (c10d.cc)
  m.attr("TINY_BYTES") = kTinyBytes;
  m.attr("SHM_WHOLE_REDUCE_BYTES") = ShmComm::kWholeReduceBytes;
  // the names the executor and the call check know, in their codes' order (hocc.engine.agreement,
  // hocc.engine.dtypes read these rather than keep copies)
  m.attr("COLLECTIVES") = py::tuple(py::cast(collective_names()));
  m.attr("OPS") = py::tuple(py::cast(op_names()));
  m.attr("DTYPES") = py::tuple(py::cast(dtype_names()));
  // the call check's one definition (core/call.h), for HOCC_CHECK=all's comparison over the group
  m.def("call_id", [](const CallTuple& call, const std::string& dtype, const std::string& op) {
    const CallId id = *call_id(call, dtype, op);
    return py::bytes(reinterpret_cast<const char*>(&id), sizeof id);
  }, py::arg("call"), py::arg("dtype"), py::arg("op"), "a call's 64-byte CallId, as the communicators trade it");
  auto ids = [](const py::bytes& b) {
    const std::string s = b;
    if (s.size() % sizeof(CallId)) throw Error("hocc: CallIds come in 64-byte rows");
    std::vector<CallId> rows(s.size() / sizeof(CallId));
    std::memcpy(rows.data(), s.data(), s.size());
    return rows;
  };
  m.def("describe_call", [ids](const py::bytes& id) { return describe(ids(id).at(0)); }, py::arg("id"),
        "'all_reduce of 1000 float32 (sum, ho_ring, call 5)'");
  m.def("call_group_differences", [ids](const py::bytes& rows) { return group_differences(ids(rows)); },
        py::arg("rows"), "every rank's CallId, concatenated by rank: '' or what differs, naming the ranks");

  py::class_<GroupTransport>(m, "GroupTransport", "one rank of a multi-process group (transport/group.h)")
      .def(py::init([](int rank, int size, const std::string& device) {
             return std::make_unique<GroupTransport>(rank, size, make_device(device));
           }),
           py::arg("rank"), py::arg("size"), py::arg("device") = "cpu")
      .def("add", [](GroupTransport& t, int stage, const std::vector<int>& ranks, const std::string& impl,
                     std::shared_ptr<Comm> comm) { t.add(stage, ranks, parse_impl(impl), std::move(comm)); },
           py::arg("stage"), py::arg("ranks"), py::arg("impl"), py::arg("comm"))
      .def("has", [](const GroupTransport& t, int stage, const std::vector<int>& ranks, const std::string& impl) {
        return t.has(stage, ranks, parse_impl(impl));
      }, py::arg("stage"), py::arg("ranks"), py::arg("impl"))
      .def_property_readonly("is_async", &GroupTransport::async,
                             "true on a GPU: runs only enqueue on streams, and the host never waits for them")
      .def_property_readonly("held_bytes", &GroupTransport::held_bytes,
                             "bytes of scratch the communicators hold between calls")
      .def("clear", &GroupTransport::clear)
      .def("abort", &GroupTransport::abort, py::arg("why"));

  auto run = [](Executor& e, const Plan& plan, uintptr_t input, uintptr_t output, uintptr_t work,
                const std::string& dtype, const std::string& op, uintptr_t stream, std::optional<CallTuple> call,
                int64_t seq) {
    DType t = parse_dtype(dtype);
    RedOp o = parse_op(op);
    const std::optional<CallId> id = call_id(call, dtype, op);
    py::gil_scoped_release nogil;
    e.run(plan, {ptr(input), ptr(output), ptr(work)}, t, o, op == "avg", ptr(stream), id ? &*id : nullptr, seq);
  };
  auto executor = py::class_<Executor>(m, "Executor", "runs plans for one rank over a transport (executor/executor.h)");
  executor
      .def(py::init([](GroupTransport& t) { return std::make_unique<Executor>(t); }), py::keep_alive<1, 2>())
      .def("run", run, py::arg("plan"), py::arg("input"), py::arg("output"), py::arg("work"), py::arg("dtype"),
           py::arg("op"), py::arg("stream") = 0, py::arg("call") = py::none(), py::arg("seq") = -1)
      .def("set_trace", &Executor::set_trace)
      .def_property_readonly("held_bytes", &Executor::held_bytes, "bytes of work buffer held between calls")
      .def("inject_fault", [](Executor& e, int stage, const std::string& action, py::object hook) {
        std::function<void()> fn;
        if (!hook.is_none()) {
          std::shared_ptr<py::object> held = held_object(std::move(hook));  // copies of fn need no GIL
          fn = [held] {  // on a lane thread, without the GIL (runs release it)
            py::gil_scoped_acquire gil;
            try {
              (*held)();
            } catch (py::error_already_set& x) {
              throw Error(std::string("hocc: the injected fault's hook raised: ") + x.what());
            }
          };
        }
        e.inject_fault(stage, action, std::move(fn));
      }, py::arg("stage"), py::arg("action"), py::arg("hook") = py::none(),
           "for fault tests: fail in the next run on reaching `stage` (raise, kill, stop or exit), or call `hook`")
      .def("take_timings", [](Executor& e) {
        std::vector<std::tuple<int, int, std::string, double>> out;
        for (const auto& x : e.take_timings()) out.emplace_back(x.stage, x.chunk, op_name(x.op), x.seconds);
        return out;
      }, "(stage, chunk, collective, seconds) of each step run since the last call, in trace mode")
      .def("set_record", &Executor::set_record, py::arg("keep"),
           "keep the records of the latest `keep` runs (0: record nothing; core/record.h)")
      .def("records", &Executor::records, "the kept RunRecords, oldest first (also while a run goes)");

  bind_call_queue(m);
  bind_repeat(m);

  py::class_<RunRecord, std::shared_ptr<RunRecord>>(m, "RunRecord",
                                                    "one run's steps and ring exchanges, as this rank ran them")
      .def_property_readonly("seq", &RunRecord::seq)
      .def_property_readonly("begin_ns", &RunRecord::begin_ns)
      .def_property_readonly("end_ns", &RunRecord::end_ns, "0 while the run has not ended")
      .def("steps", [](const RunRecord& r) {
        std::vector<std::tuple<int32_t, int32_t, int64_t, int64_t>> out;
        for (const auto& x : r.steps()) out.emplace_back(x.step, x.group, x.begin_ns, x.end_ns);
        return out;
      }, "(plan step index, group index in it, begin ns, end ns or 0) per step this rank began")
      .def("exchanges", [](const RunRecord& r) {
        std::vector<std::tuple<int32_t, int32_t, int32_t, int64_t, int64_t, int64_t, int64_t, int64_t>> out;
        for (const auto& x : r.exchanges())
          out.emplace_back(x.step, x.to, x.from, x.post_ns, x.done_ns, x.end_ns, x.sent, x.received);
        return out;
      }, "(index into steps(), successor, predecessor, posted ns, receive ended ns, ended ns, bytes sent, bytes "
         "received) per ring step");

  m.def("reduce", [](uintptr_t dst, uintptr_t src, size_t n, const std::string& dtype, const std::string& op,
                     const std::string& device) {
    DType t = parse_dtype(dtype);
    RedOp o = op == "copy" ? RedOp::none : parse_op(op);
    Device& dev = device_named(device);
    py::gil_scoped_release nogil;
    dev.reduce(ptr(dst), ptr(src), n, t, o, nullptr);
  }, "dst = dst (op) src by the device layer (on a GPU: on the current stream, not waited for)", py::arg("dst"),
        py::arg("src"), py::arg("n"), py::arg("dtype"), py::arg("op"), py::arg("device") = "cpu");
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
      .def("run", &InProcRunner::run, py::arg("plan"), py::arg("inputs"), py::arg("outputs"), py::arg("works"),
           py::arg("dtype"), py::arg("op"), py::arg("fail_rank") = -1, py::arg("absent_rank") = -1,
           py::arg("slow_rank") = -1, py::arg("slow_s") = 0.0)
      .def("last_record", &InProcRunner::last_record, py::arg("rank"), "rank's latest RunRecord, or None");

  py::class_<ShmComm, Comm, std::shared_ptr<ShmComm>>(m, "ShmComm",
                                                     "one host group's shared-memory segment (transport/shm.h)")
      .def(py::init([](const std::string& path, int me, int n, size_t half_bytes, double timeout_s,
                       const std::string& wait) {
             return std::make_shared<ShmComm>(path, me, n, half_bytes, timeout_s, parse_wait_mode(wait));
           }),
           py::arg("path"), py::arg("me"), py::arg("n"), py::arg("half_bytes"), py::arg("timeout_s"),
           py::arg("wait") = "futex")
      .def_static("segment_bytes", &ShmComm::segment_bytes)
      .def_static("header_bytes", &ShmComm::header_bytes)
      .def_property_readonly("broken", &ShmComm::broken)
      .def_property_readonly("barriers", &ShmComm::barriers)
      .def_property_readonly("wait_seconds", &ShmComm::wait_seconds);

  m.def("ucx_unavailable", &ucx_unavailable, "'' when UCX can carry steps between hosts here, else why not");
  m.def("ucx_version", &ucx_version, "the UCX library's version ('' when built without UCX)");
  py::class_<UcxComm, Comm, std::shared_ptr<UcxComm>>(m, "UcxComm", "ring steps over UCX (transport/ucx.h)")
      .def(py::init<int, int, double, double>(), py::arg("me"), py::arg("n"), py::arg("timeout_s"),
           py::arg("spin_us"))
      .def_property_readonly("address", [](const UcxComm& c) { return py::bytes(c.address()); })
      .def("connect", [](UcxComm& c, const std::vector<py::bytes>& addresses) {
        std::vector<std::string> all(addresses.begin(), addresses.end());
        py::gil_scoped_release nogil;
        c.connect(std::move(all));
      }, py::arg("addresses"), "every member's worker address, in member order")
      .def_property_readonly("broken", &UcxComm::broken)
      .def_property_readonly("progress_calls", &UcxComm::progress_calls)
      .def_property_readonly("sleeps", &UcxComm::sleeps);

}
