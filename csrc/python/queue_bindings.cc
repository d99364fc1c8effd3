// hocc._C.CallQueue: the engine's call queue (executor/call_queue.h) for
// hocc/engine/queue.py, bound by bind_call_queue (called from bindings.cc).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>

#include "core/call.h"
#include "core/plan.h"
#include "core/types.h"
#include "executor/call_queue.h"
#include "executor/executor.h"
#include "python/common.h"

namespace py = pybind11;
using namespace hocc;

namespace {

// The engine's call queue (executor/call_queue.h) for hocc/engine/queue.py.
// Every item is a plan run (PlanRun), pushed with everything it needs by value
// (the plan, executor and tensors are kept alive on the Python side until the
// ticket is done); a plain one runs with no Python in it. A failure calls back
// into Python, under the GIL: on_error(ticket, error), error the exception to
// raise (python_error). on_done(completed) is called after a ticket someone
// watch()ed.
// At interpreter exit a thread that takes the GIL is ended on the spot (pthread_exit): then the
// queue's Python callbacks and frees are skipped. hocc/executor/lifecycle.py has drained and closed
// every queue before that, in its exit hooks, and its last hook sets python_ended (Python's public
// Py_IsFinalizing is 3.13's; before it only a private function says so).
std::atomic<bool> python_ended{false};

}  // namespace

bool python_ending() {
#if PY_VERSION_HEX >= 0x030D0000
  if (Py_IsFinalizing()) return true;
#endif
  return python_ended.load(std::memory_order_acquire);
}

std::shared_ptr<py::object> held_object(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* held) {
    if (!*held) {  // let go of under the GIL already (e.g. a queue item that ran)
      delete held;
      return;
    }
    if (python_ending()) return;  // freed at the interpreter's end: left to it
    py::gil_scoped_acquire gil;
    delete held;
  });
}

namespace {

// fn() without the GIL. Not pybind's RAII gil_scoped_release: a thread that takes the GIL back
// while Python is ending is ended there (pthread_exit), and that unwind must not start in a
// destructor (noexcept: std::terminate). Here it leaves through pybind's dispatcher, which lets it go.
template <class F>
auto without_gil(F&& fn) {
  using R = decltype(fn());
  PyThreadState* st = PyEval_SaveThread();
  if constexpr (std::is_void_v<R>) {
    try {
      fn();
    } catch (...) {
      PyEval_RestoreThread(st);
      throw;
    }
    PyEval_RestoreThread(st);  // outside the try: its unwind must not meet the catch above
  } else {
    std::optional<R> r;
    try {
      r.emplace(fn());
    } catch (...) {
      PyEval_RestoreThread(st);
      throw;
    }
    PyEval_RestoreThread(st);
    return std::move(*r);
  }
}

// How a plan run ended: no error if it ran to its end.
struct Failure {
  std::exception_ptr error;
};

// One plan run with everything it needs by value (the plan, executor and tensors are kept alive on
// the Python side until its item is done). Once the group failed (`failed`), it does not start; a run
// that fails sets `failed`, so that later runs do not start, whatever Python does.
// A plain run has no Python in it. A run with `around` (what a call needs of Python around its run:
// its first set-up, a tuning trial's timing, HOCC_CHECK=all, trace, a CUDA stream) calls around(run)
// holding the GIL, `run` being this plan's run without it; an exception around raises is the run's
// failure, as the executor's own is. Either way it is one run, of one item of the queue.
class PlanRun {
 public:
  PlanRun(Executor& e, const Plan& plan, uintptr_t input, uintptr_t output, const std::string& dtype,
          const std::string& op, const std::optional<CallTuple>& call, int64_t seq,
          std::shared_ptr<py::object> around = nullptr)
      : ex_(&e), plan_(&plan), input_(input), output_(output), dtype_(parse_dtype(dtype)), op_(parse_op(op)),
        average_(op == "avg"), id_(call_id(call, dtype, op)), seq_(seq), around_(std::move(around)) {}

  // this run again on other buffers, as call `seq` (its call id renumbered alike)
  PlanRun with(uintptr_t input, uintptr_t output, int64_t seq) const {
    PlanRun r = *this;
    r.input_ = input, r.output_ = output, r.seq_ = seq;
    if (r.id_) r.id_->seq = uint64_t(seq);
    return r;
  }

  Failure operator()(std::atomic<bool>& failed) const {
    if (failed.load(std::memory_order_acquire))  // the engine answers
      return {std::make_exception_ptr(Error("the group failed earlier"))};
    Failure f;
    try {
      if (around_)
        run_around();
      else
        run_plain();
      return f;
    } catch (...) {
      f.error = std::current_exception();
    }
    failed.store(true, std::memory_order_release);
    return f;
  }

 private:
  void run_plain() const {
    ex_->run(*plan_, {ptr(input_), ptr(output_), nullptr}, dtype_, op_, average_, nullptr, id_ ? &*id_ : nullptr,
             seq_);
  }

  void run_around() const {
    if (python_ending()) throw Error("hocc: the interpreter is ending: a call that needs Python cannot run");
    PlanRun plain = *this;  // by value: Python may keep `run` past this item
    plain.around_.reset();
    py::gil_scoped_acquire gil;
    try {
      (*around_)(py::cpp_function([plain] { without_gil([&] { plain.run_plain(); }); }));
    } catch (py::error_already_set& e) {  // held as a Python object: freed under the GIL, or not at exit
      throw PythonFailure(held_object(e.value()), e.what());
    }
  }

  Executor* ex_;
  const Plan* plan_;
  uintptr_t input_, output_;
  DType dtype_;
  RedOp op_;
  bool average_;
  std::optional<CallId> id_;
  int64_t seq_;
  std::shared_ptr<py::object> around_;
};

// `o` for a PlanRun's around: null for None (a plain run)
std::shared_ptr<py::object> held(py::object o) { return o.is_none() ? nullptr : held_object(std::move(o)); }

class PyCallQueue {
 public:
  PyCallQueue(py::function on_error, py::function on_done)
      : on_error_(std::move(on_error)), on_done_(std::move(on_done)) {
    q_ = std::make_unique<CallQueue>([this](uint64_t done) {
      if (python_ending()) return;
      py::gil_scoped_acquire gil;
      try {
        on_done_(done);
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("hocc call queue: on_done");
      }
    });
  }
  ~PyCallQueue() {
    py::gil_scoped_release nogil;  // the worker may be waiting for the GIL (a run with Python around it)
    q_.reset();
  }

  // Queue Executor.run of `plan` (around it, `around`: PlanRun); no Python runs for a plain one unless
  // it fails (on_error, under the GIL).
  uint64_t push_run(Executor& e, const Plan& plan, uintptr_t input, uintptr_t output, const std::string& dtype,
                    const std::string& op, const std::optional<CallTuple>& call, int64_t seq, py::object around) {
    // `around` is freed under the GIL wherever the item goes (run on the worker, or dropped by cancel)
    return push_plan(PlanRun(e, plan, input, output, dtype, op, call, seq, held(std::move(around))));
  }
  uint64_t push_plan(const PlanRun& run) {
    return q_->push([this, run](uint64_t ticket) {
      Failure f = run(failed_);
      if (!f.error || python_ending()) return;
      py::gil_scoped_acquire gil;
      try {
        on_error_(ticket, python_error(f.error));
      } catch (py::error_already_set& x) {
        x.discard_as_unraisable("hocc call queue: on_error");
      }
    });
  }

  // A sync call's plan run on this thread, without the GIL (around it, `around`), if nothing is queued
  // or running: true once it ran, and its failure raises here (MismatchError or Error: the engine names
  // it; or around's own exception); false if the queue is busy (nothing done: push_run it).
  bool run_here(Executor& e, const Plan& plan, uintptr_t input, uintptr_t output, const std::string& dtype,
                const std::string& op, const std::optional<CallTuple>& call, int64_t seq, py::object around) {
    return run_plan_here(PlanRun(e, plan, input, output, dtype, op, call, seq, held(std::move(around))));
  }
  bool run_plan_here(const PlanRun& run) {
    Failure f;
    const bool ran = without_gil([&] { return q_->run_here([&](uint64_t) { f = run(failed_); }); });
    if (f.error) std::rethrow_exception(f.error);
    return ran;
  }

  bool run_queued_here(uint64_t ticket) {
    return without_gil([&] { return q_->run_queued_here(ticket); });
  }

  // in slices, so that Ctrl-C (a signal Python handles on the main thread) ends a wait
  int wait(uint64_t ticket, double timeout_s) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_s);
    for (;;) {
      double slice = 0.1;
      if (timeout_s >= 0)
        slice = std::min(slice, std::chrono::duration<double>(until - std::chrono::steady_clock::now()).count());
      const CallQueue::Wait w = without_gil([&] { return q_->wait(ticket, std::max(slice, 0.0)); });
      if (w != CallQueue::kTimedOut) return w;
      if (PyErr_CheckSignals() != 0) throw py::error_already_set();
      if (timeout_s >= 0 && std::chrono::steady_clock::now() >= until) return w;
    }
  }
  // The engine's next call: its number (calls made so far, alike on every rank) and, as the last call's,
  // its plan `entry` (hocc.engine.plan_cache.Compiled). Here, not in the engine, so that a repeated call
  // made in C++ (repeat_bindings.cc) counts as one made in Python does. Under the GIL.
  int64_t begin(py::object entry) {
    last_ = std::move(entry);
    return made_++;
  }
  int64_t made() const { return made_; }
  py::object last() const { return last_; }

  CallQueue& q() { return *q_; }
  void mark_failed() { failed_.store(true, std::memory_order_release); }
  void close() {
    without_gil([&] { q_->close(); });
  }
  void join() {
    without_gil([&] { q_->join(); });
  }

 private:
  py::function on_error_, on_done_;
  int64_t made_ = 0;
  py::object last_ = py::none();
  std::atomic<bool> failed_{false};
  std::unique_ptr<CallQueue> q_;  // last: its worker stops before the callbacks go
};

// A call shape made once (executor, plan, dtype, op, call check) for calls that repeat it: each run is
// one crossing into C++ with the buffers and the call number, on this thread or queued (the engine's
// prepared calls). Holds its
// queue, executor and plan alive.
class PreparedRun final : public PreparedCall {
 public:
  PreparedRun(py::object queue, py::object executor, py::object plan, const std::string& dtype,
              const std::string& op, const std::optional<CallTuple>& call, int64_t calls)
      : proto_(executor.cast<Executor&>(), plan.cast<const Plan&>(), 0, 0, dtype, op, call, 0),
        queue_(std::move(queue)), executor_(std::move(executor)), plan_(std::move(plan)),
        q_(&queue_.cast<PyCallQueue&>()), left_(calls) {}

  bool take() override {
    if (left_ == 0) return false;
    if (left_ > 0) --left_;
    return true;
  }
  int64_t left() const { return left_; }

  int64_t begin(py::handle entry) override { return q_->begin(py::reinterpret_borrow<py::object>(entry)); }
  bool run_here(uintptr_t input, uintptr_t output, int64_t seq) override {
    return q_->run_plan_here(proto_.with(input, output, seq));
  }
  uint64_t push(uintptr_t input, uintptr_t output, int64_t seq) { return q_->push_plan(proto_.with(input, output, seq)); }

 private:
  PlanRun proto_;
  py::object queue_, executor_, plan_;
  PyCallQueue* q_;
  int64_t left_;  // calls it may still run (-1: any number; auto's calls before its trials: a count)
};

}  // namespace

PreparedCall& prepared_call(py::handle run) { return run.cast<PreparedRun&>(); }

void bind_call_queue(py::module_& m) {
  m.def("mark_python_ending", [] { python_ended.store(true, std::memory_order_release); },
        "from Python's last exit hook (hocc/executor/lifecycle.py): no queue worker takes the GIL after it");
  py::class_<PyCallQueue>(m, "CallQueue", "an engine's calls, run in order on one C++ thread (executor/call_queue.h)")
      .def(py::init<py::function, py::function>(), py::arg("on_error"), py::arg("on_done"))
      .def("push_run", &PyCallQueue::push_run, py::arg("executor"), py::arg("plan"), py::arg("input"),
           py::arg("output"), py::arg("dtype"), py::arg("op"), py::arg("call"), py::arg("seq"),
           py::arg("around") = py::none(),
           "queue Executor.run of `plan`, within around(run) if given (no Python runs for a plain one unless "
           "it fails); returns its ticket")
      .def("run_here", &PyCallQueue::run_here, py::arg("executor"), py::arg("plan"), py::arg("input"),
           py::arg("output"), py::arg("dtype"), py::arg("op"), py::arg("call"), py::arg("seq"),
           py::arg("around") = py::none(),
           "a sync call's plan run on this thread (within around(run) if given) if the queue is idle (its "
           "failure raises); False if busy")
      .def("run_queued_here", &PyCallQueue::run_queued_here, py::arg("ticket"),
           "run item `ticket` on this thread, without the GIL, if it is next and not begun: True once it ran")
      .def("wait", &PyCallQueue::wait, py::arg("ticket"), py::arg("timeout_s") = -1.0,
           "0: done, 1: dropped by cancel(), 2: timed out")
      .def_property_readonly("completed", [](PyCallQueue& q) { return q.q().completed(); })
      .def_property_readonly("pushed", [](PyCallQueue& q) { return q.q().pushed(); })
      .def("dropped", [](PyCallQueue& q, uint64_t t) { return q.q().dropped(t); }, py::arg("ticket"))
      .def("watch", [](PyCallQueue& q, uint64_t t) { return q.q().watch(t); }, py::arg("ticket"),
           "call on_done once `ticket` is done; False if it already is")
      .def("busy_for", [](PyCallQueue& q) { return q.q().busy_for(); }, "seconds the running item has run; 0: idle")
      .def_property_readonly("on_worker", [](PyCallQueue& q) { return q.q().on_worker(); })
      .def("begin", &PyCallQueue::begin, py::arg("entry"),
           "the next call's number; `entry` (its plan) is the last call's from now")
      .def_property_readonly("made", &PyCallQueue::made, "calls begun so far")
      .def_property_readonly("last", &PyCallQueue::last, "the last call's plan entry (None before the first)")
      .def("mark_failed", &PyCallQueue::mark_failed, "plan runs not begun fail without running (the group failed)")
      .def("close", &PyCallQueue::close, "run what is queued, then stop and join the worker")
      .def("cancel", [](PyCallQueue& q, const std::string& why) { return q.q().cancel(why); }, py::arg("why"),
           "drop what is not begun (tickets from the one returned on); the worker stops after its item")
      .def("join", &PyCallQueue::join);
  py::class_<PreparedRun>(m, "PreparedRun", "one call shape's plan run, made once: run_here or push(input, output, seq)")
      .def(py::init<py::object, py::object, py::object, const std::string&, const std::string&,
                    const std::optional<CallTuple>&, int64_t>(),
           py::arg("queue"), py::arg("executor"), py::arg("plan"), py::arg("dtype"), py::arg("op"), py::arg("call"),
           py::arg("calls") = -1)
      .def("take", &PreparedRun::take, "one call of it, if it has one left (then True)")
      .def_property_readonly("left", &PreparedRun::left, "calls it may still run (-1: any number)")
      .def("run_here", &PreparedRun::run_here, py::arg("input"), py::arg("output"), py::arg("seq"),
           "CallQueue.run_here of this plan on these buffers as call `seq` (the call check's number too)")
      .def("push", &PreparedRun::push, py::arg("input"), py::arg("output"), py::arg("seq"),
           "CallQueue.push_run of this plan on these buffers as call `seq`; its ticket");

}
