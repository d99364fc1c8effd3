// hocc._C's table of repeated sync calls for the drop-in calls (hocc/api/repeat.py): a call whose
// arguments, as passed (collective, group, op, algo, the tensors' dtype and sizes), name a call shape its
// group's engine has prepared runs from here, from its arguments to its plan run, with no Python frame
// but the drop-in function's own. Anything else, or anything unusual, is a miss: the full way in Python
// (validate, find the engine, plan) runs the call, raises what is wrong, and teaches this table the
// shape once its engine has prepared it.
//
// Why C++: on ranks that share cores (8 on 2 here) each microsecond of a call's Python costs several of
// every rank's call time. The same table in Python cost a 32-byte all_reduce on 8 local ranks 57 us a call
// against 17 us for its plan run alone (docs/executor.md, "The call queue": "A prepared call").
#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <unordered_map>

#include "core/record.h"
#include "python/common.h"

namespace py = pybind11;

namespace {

// identities, as the drop-in call passed them (op, algo and dtype are held by the entry, so that their ids
// stay theirs; the group weakly, as its engine holds it); an algo string by its value (interned)
struct Key {
  int collective;
  PyObject *group, *op, *algo, *dtype;
  int64_t n_in, n_out;
  bool operator==(const Key& o) const {
    return collective == o.collective && group == o.group && op == o.op && algo == o.algo && dtype == o.dtype &&
           n_in == o.n_in && n_out == o.n_out;
  }
};

struct KeyHash {
  size_t operator()(const Key& k) const {
    size_t h = std::hash<int>()(k.collective);
    for (const void* p : {static_cast<const void*>(k.group), static_cast<const void*>(k.op),
                          static_cast<const void*>(k.algo), static_cast<const void*>(k.dtype)})
      h = h * 1000003u ^ std::hash<const void*>()(p);
    return (h * 1000003u ^ std::hash<int64_t>()(k.n_in)) * 1000003u ^ std::hash<int64_t>()(k.n_out);
  }
};

struct Entry {
  py::object op, algo, dtype;  // the key's objects
  py::object group_ref;        // a weakref to the engine's group: a call must name that group (None: the world)
  py::object prepared;         // hocc.engine.prepared.Prepared
  py::object run;              // its hocc._C.PreparedRun (prepared.run may be dropped meanwhile)
  PreparedCall* call;          // run's C++ side
  py::object entry;            // the plan entry it runs (the engine's last_plan)
  py::object record;           // its engine's recorder's calls.append, or None (recorder off)
  py::object fields;           // a record's fields after its number: (collective, count, dtype, elem_size, op, entry)
  py::object note;             // tells the heap trimmer a CPU call ran (hocc/engine/heap.py)
  py::object failed;           // failed(prepared, seq, error) -> the exception the call raises
  py::object busy;             // busy(prepared, input, output, seq): the call queued behind earlier ones
};

constexpr size_t kMaxEntries = 256;  // shapes kept; a full table starts over (the engines' plan caches' size)

struct Table {
  std::unordered_map<Key, Entry, KeyHash> entries;
  PyObject* tensor_types[2] = {nullptr, nullptr};  // torch.Tensor and torch.nn.Parameter (held for good)
  PyObject* world = nullptr;                       // torch.distributed's _World (held for good)
};

// never freed: its Python objects must not be let go of after the interpreter ended (at exit, hocc's
// engines are closed or drained before; what is left goes with the process)
Table& table() {
  static Table* t = new Table();
  return *t;
}

// set while hocc/engine/heap.py's trimmer needs no note of a call (it has one since its last trim)
std::atomic<bool> heap_noted{false};

PyObject* const* names() {
  static PyObject* n[6] = {PyUnicode_InternFromString("dtype"), PyUnicode_InternFromString("numel"),
                           PyUnicode_InternFromString("is_cpu"), PyUnicode_InternFromString("is_contiguous"),
                           PyUnicode_InternFromString("data_ptr"), PyUnicode_InternFromString("_default_pg")};
  return n;
}
enum Name { kDtype, kNumel, kIsCpu, kIsContiguous, kDataPtr, kDefaultPg };

// a plain CPU tensor's dtype, numel and address; false (no Python error set) for anything else
struct View {
  py::object dtype;
  int64_t numel = 0;
  uintptr_t data = 0;
};

bool method_true(PyObject* o, Name n) {
  PyObject* r = PyObject_CallMethodNoArgs(o, names()[n]);
  const bool yes = r == Py_True;
  Py_XDECREF(r);
  return yes;
}

bool view(PyObject* t, View& v) {
  const Table& tab = table();
  if (Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(tab.tensor_types[0]) &&
      Py_TYPE(t) != reinterpret_cast<PyTypeObject*>(tab.tensor_types[1]))
    return false;  // not a tensor, or a subclass (its own __torch_function__ may matter): the full way
  v.dtype = py::reinterpret_steal<py::object>(PyObject_GetAttr(t, names()[kDtype]));
  PyObject* n = PyObject_CallMethodNoArgs(t, names()[kNumel]);
  PyObject* cpu = PyObject_GetAttr(t, names()[kIsCpu]);
  const bool ok = v.dtype && n && cpu == Py_True && method_true(t, kIsContiguous);
  if (ok) v.numel = PyLong_AsLongLong(n);
  Py_XDECREF(n);
  Py_XDECREF(cpu);
  if (!ok) return false;
  PyObject* p = PyObject_CallMethodNoArgs(t, names()[kDataPtr]);
  if (p == nullptr) return false;
  v.data = uintptr_t(PyLong_AsUnsignedLongLong(p));
  Py_DECREF(p);
  return !PyErr_Occurred();
}

// `algo` as the key holds it: a string interned (a name made at run time is the same key as a literal)
py::object key_algo(PyObject* algo) {
  Py_INCREF(algo);
  if (PyUnicode_CheckExact(algo)) PyUnicode_InternInPlace(&algo);
  return py::reinterpret_steal<py::object>(algo);
}

// The group a call names: `group`, or for None the world now (it may have been made again since)
PyObject* named_group(PyObject* group) {
  if (group != Py_None) return group;
  PyObject* w = PyObject_GetAttr(table().world, names()[kDefaultPg]);
  Py_XDECREF(w);  // borrowed below only as an identity to compare (_World holds it)
  return w;
}

// repeat_run(collective, input, output, op, group, algo) -> True once the call ran (its failure raises as
// the full way's does), False with nothing done
PyObject* repeat_run(PyObject*, PyObject* const* args, Py_ssize_t nargs) {
  if (nargs != 6) {
    PyErr_SetString(PyExc_TypeError, "repeat_run(collective, input, output, op, group, algo)");
    return nullptr;
  }
  Table& tab = table();
  if (tab.entries.empty() || tab.world == nullptr) Py_RETURN_FALSE;
  View in, out;
  const bool viewed = view(args[1], in) && (args[2] == args[1] ? (out = in, true) : view(args[2], out));
  if (!viewed || in.dtype.ptr() != out.dtype.ptr()) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  const py::object algo = key_algo(args[5]);
  const Key key{int(PyLong_AsLong(args[0])), args[4], args[3], algo.ptr(), in.dtype.ptr(), in.numel, out.numel};
  auto it = tab.entries.find(key);
  if (it == tab.entries.end()) {
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  PyObject* engine_group = PyWeakref_GetObject(it->second.group_ref.ptr());  // borrowed; None once it died
  if (engine_group == nullptr || engine_group == Py_None) {  // its group is gone (its engine closes)
    PyErr_Clear();
    tab.entries.erase(it);
    Py_RETURN_FALSE;
  }
  PyObject* group = named_group(args[4]);
  if (group != engine_group) {  // another group, or no world (None), or an error reading it
    PyErr_Clear();
    Py_RETURN_FALSE;
  }
  if (!it->second.call->take()) {  // its calls are spent (auto's measuring starts): the full way, from now on
    tab.entries.erase(it);
    Py_RETURN_FALSE;
  }
  const Entry e = it->second;  // held here: the table may change while the run has let go of the GIL
  try {
    const int64_t seq = e.call->begin(e.entry);
    if (!heap_noted.load(std::memory_order_relaxed)) e.note();
    if (!e.record.is_none()) {  // hocc.record.recorder.Recorder.made's tuple
      py::tuple fields = py::reinterpret_borrow<py::tuple>(e.fields);
      py::tuple rec(fields.size() + 2);
      rec[0] = py::int_(seq);
      for (size_t i = 0; i < fields.size(); ++i) rec[i + 1] = fields[i];
      rec[fields.size() + 1] = py::int_(hocc::wall_ns());
      e.record(rec);
    }
    bool ran = false;
    try {
      ran = e.call->run_here(in.data, out.data, seq);
    } catch (py::error_already_set&) {
      throw;
    } catch (...) {
      py::object err = e.failed(e.prepared, seq, python_error(std::current_exception()));
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
      return nullptr;
    }
    if (!ran) e.busy(e.prepared, py::handle(args[1]), py::handle(args[2]), seq);
  } catch (py::error_already_set& x) {
    x.restore();
    return nullptr;
  }
  Py_RETURN_TRUE;
}

PyMethodDef repeat_run_def = {"repeat_run", reinterpret_cast<PyCFunction>(reinterpret_cast<void*>(repeat_run)),
                              METH_FASTCALL,
                              "repeat_run(collective, input, output, op, group, algo): run a repeated sync call of "
                              "a prepared shape; False: not one (nothing done)"};

}  // namespace

void bind_repeat(py::module_& m) {
  m.add_object("repeat_run", py::reinterpret_steal<py::object>(PyCFunction_New(&repeat_run_def, nullptr)));
  m.def("repeat_setup", [](py::object tensor, py::object parameter, py::object world) {
    Table& t = table();
    if (t.world != nullptr) return;
    t.tensor_types[0] = tensor.release().ptr();
    t.tensor_types[1] = parameter.release().ptr();
    t.world = world.release().ptr();
  }, py::arg("tensor"), py::arg("parameter"), py::arg("world"),
        "the types repeat_run takes (torch.Tensor, torch.nn.Parameter) and torch.distributed's _World, once");
  m.def("repeat_learn", [](int collective, py::object group, py::object op, py::object algo, py::object dtype,
                           int64_t n_in, int64_t n_out, py::object group_ref, py::object prepared, py::object record,
                           py::object fields, py::object note, py::object failed, py::object busy) {
    Table& t = table();
    if (t.entries.size() >= kMaxEntries) t.entries.clear();
    algo = key_algo(algo.ptr());
    py::object run = prepared.attr("run");
    Entry e{op, algo, dtype, std::move(group_ref), prepared, run, &prepared_call(run), prepared.attr("entry"),
            std::move(record), std::move(fields), std::move(note), std::move(failed), std::move(busy)};
    t.entries[Key{collective, group.ptr(), op.ptr(), algo.ptr(), dtype.ptr(), n_in, n_out}] = std::move(e);
  }, py::arg("collective"), py::arg("group"), py::arg("op"), py::arg("algo"), py::arg("dtype"), py::arg("n_in"),
        py::arg("n_out"), py::arg("group_ref"), py::arg("prepared"), py::arg("record"), py::arg("fields"),
        py::arg("note"), py::arg("failed"), py::arg("busy"),
        "keep a prepared call shape, keyed by the drop-in call's arguments (hocc/api/repeat.py's learn)");
  m.def("repeat_forget", [](py::object run) {
    auto& entries = table().entries;
    for (auto it = entries.begin(); it != entries.end();)
      it = it->second.run.is(run) ? entries.erase(it) : std::next(it);
  }, py::arg("run"), "forget the shapes that run `run` (its engine dropped it)");
  m.def("repeat_clear", [] { table().entries.clear(); }, "forget every shape (the settings changed)");
  m.def("repeat_size", [] { return table().entries.size(); }, "shapes kept");
  m.def("set_heap_noted", [](bool noted) { heap_noted.store(noted, std::memory_order_relaxed); }, py::arg("noted"),
        "whether the heap trimmer has a call noted since its last trim (then repeat_run does not tell it again)");
}
