// What the binding files share (bindings.cc, queue_bindings.cc): buffers cross as
// integer addresses, and a call's id as the tuple hocc.engine.agreement.Call.native()
// gives.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <exception>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>

#include "core/call.h"

inline void* ptr(uintptr_t a) { return reinterpret_cast<void*>(a); }

// (seq, plan hash, count, collective, algo): what every member must agree on (core/call.h)
using CallTuple = std::tuple<uint64_t, uint64_t, int64_t, std::string, std::string>;

inline std::optional<hocc::CallId> call_id(const std::optional<CallTuple>& call, const std::string& dtype,
                                           const std::string& op) {
  if (!call) return std::nullopt;
  const auto& [seq, hash, count, collective, algo] = *call;
  return hocc::make_call_id(seq, hash, count, collective, dtype, op, algo);
}

void bind_call_queue(pybind11::module_& m);  // queue_bindings.cc

// Whether the interpreter is ending (then no thread may take the GIL: it would be ended there). queue_bindings.cc
bool python_ending();
// A Python object C++ can copy around without the GIL: the last copy lets go of it under the GIL (and not at
// all once Python is ending). queue_bindings.cc
std::shared_ptr<pybind11::object> held_object(pybind11::object o);

// A Python exception raised around a plan run (queue_bindings.cc's PlanRun), carried through C++ as the
// object itself: python_error gives it back, and raised from a binding it is that exception again.
struct __attribute__((visibility("hidden"))) PythonFailure : std::runtime_error {  // hidden, as pybind11 is
  PythonFailure(std::shared_ptr<pybind11::object> exc, const std::string& what)
      : std::runtime_error(what), exc(std::move(exc)) {}
  std::shared_ptr<pybind11::object> exc;
};

// A failure as the Python exception hocc raises from it: HoccNativeError or HoccMismatchError with the
// fields of hocc::Error (stage, chunk, step, ranks, cause; stage -1 outside any step), or a PythonFailure's
// own exception. Holds the GIL.
pybind11::object python_error(const std::exception_ptr& e);  // bindings.cc

// A prepared call shape's run (queue_bindings.cc's PreparedRun), as the drop-in's table of repeated calls
// (repeat_bindings.cc) calls it: with no pybind11 dispatch in between.
struct PreparedCall {
  virtual ~PreparedCall() = default;
  // one call of it, if it has one left (a shape auto runs only until its trials start has a count)
  virtual bool take() = 0;
  // the call's number on its engine's queue, whose last call's plan is `entry` from now (PyCallQueue::begin)
  virtual int64_t begin(pybind11::handle entry) = 0;
  // the run on this thread if the queue is idle (false: busy, nothing done); a failure throws
  virtual bool run_here(uintptr_t input, uintptr_t output, int64_t seq) = 0;
};
PreparedCall& prepared_call(pybind11::handle run);  // queue_bindings.cc; cast_error for another object

void bind_repeat(pybind11::module_& m);  // repeat_bindings.cc
