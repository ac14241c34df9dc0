// _aotpack_binding: aotpack.load's per-call path as a CPython extension. A ctypes call of the
// runtime, the TensorImpl hand-over of its inputs and a DLPack import per output cost ~2.6 us
// from Python (views_cat: 5.6 against 3.0-3.3 us per call at 2 threads); here the same steps are
// a few C++ calls.
//
// The extension does not link libaotpack_runtime: aotpack.loader loads that library with
// ctypes and passes the addresses of aotpack_model_run_torch and aotpack_last_error, so the
// binding always calls the very library that loaded the model (one copy per process).
// It links libtorch_python for THPVariable_* (torch.Tensor <-> at::Tensor) and ATen for
// at::fromDLPackVersioned.
//
//   Runner(run_torch_address, last_error_address, model_handle, num_outputs, error_type, name)
//   runner.run(*tensors) -> list[torch.Tensor], or None when an input is not exactly a CPU
//       torch.Tensor the runtime takes as it is (nothing ran: pass them by DLPack instead)
//   runner.enter() / runner.leave(): bracket another use of the model handle (the DLPack path)
//   runner.close() -> bool: wait for running calls, refuse new ones; True for the first close
//       (its caller frees the model handle)
#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <ATen/DLConvertor.h>
#include <torch/csrc/autograd/python_variable.h>

#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

#include "aotpack/dlpack.h"

namespace {

using RunTorchFn = int32_t (*)(void*, void* const*, int64_t, DLManagedTensorVersioned**, int64_t);
using LastErrorFn = const char* (*)();
constexpr int32_t kNotPlain = 2;  // AOTPACK_STATUS_NOT_PLAIN (runtime.h)

struct Runner {
  PyObject_HEAD
  RunTorchFn run_torch;
  LastErrorFn last_error;
  void* model;
  int64_t num_outputs;
  PyObject* error_type;  // aotpack.errors.AotpackError
  PyObject* closed_message;  // "model 'mlp' 0.1.0 is closed"
  // Guards active and closing; close() waits on `idle` (without the GIL) for running calls.
  std::mutex* lock;
  std::condition_variable* idle;
  int64_t active;
  bool closing;
};

// Counts one use of the model handle; false (error set) once close() began. The error is
// raised after the lock is released: creating it may run a collection, and a __del__ there
// may close another model, which releases the GIL.
bool enter(Runner* self) {
  if (self->model == nullptr) {
    PyErr_SetString(PyExc_RuntimeError, "Runner used before __init__");
    return false;
  }
  bool closing;
  {
    std::lock_guard<std::mutex> guard(*self->lock);
    closing = self->closing;
    if (!closing) ++self->active;
  }
  if (closing) PyErr_SetObject(self->error_type, self->closed_message);
  return !closing;
}

void leave(Runner* self) {
  std::lock_guard<std::mutex> guard(*self->lock);
  if (--self->active == 0 && self->closing) self->idle->notify_all();
}

// Frees outputs[from, count): handed out by the runtime, not yet owned by a tensor.
void free_outputs(DLManagedTensorVersioned** outputs, int64_t from, int64_t count) {
  for (int64_t i = from; i < count; ++i)
    if (outputs[i] != nullptr && outputs[i]->deleter != nullptr) outputs[i]->deleter(outputs[i]);
}

// torch tensors over the runtime's outputs (no copy): a new list, or NULL with an error set
// (every output is then freed, none leaks).
PyObject* wrap_outputs(DLManagedTensorVersioned** outputs, int64_t count) {
  PyObject* list = PyList_New(count);
  for (int64_t i = 0; i < count; ++i) {
    PyObject* tensor = nullptr;
    if (list != nullptr) {
      try {
        at::Tensor t = at::fromDLPackVersioned(outputs[i]);  // owns outputs[i] from here on
        outputs[i] = nullptr;
        tensor = THPVariable_Wrap(std::move(t));
      } catch (const std::exception& error) {
        PyErr_SetString(PyExc_RuntimeError, error.what());
      }
    }
    if (tensor == nullptr) {
      free_outputs(outputs, i, count);
      Py_XDECREF(list);
      return nullptr;
    }
    PyList_SET_ITEM(list, i, tensor);
  }
  return list;
}

PyObject* runner_run(Runner* self, PyObject* const* args, Py_ssize_t nargs) {
  // Exactly torch.Tensor (no subclass, not even nn.Parameter, as aotpack.loader's ctypes
  // path): its TensorImpl goes in; the runtime checks the rest.
  std::vector<void*> inputs(static_cast<size_t>(nargs));
  for (Py_ssize_t i = 0; i < nargs; ++i) {
    if (Py_TYPE(args[i]) != reinterpret_cast<PyTypeObject*>(THPVariableClass)) Py_RETURN_NONE;
    inputs[i] = THPVariable_Unpack(args[i]).unsafeGetTensorImpl();
  }
  std::vector<DLManagedTensorVersioned*> outputs(static_cast<size_t>(self->num_outputs), nullptr);
  if (!enter(self)) return nullptr;
  int32_t status;
  std::string message;
  Py_BEGIN_ALLOW_THREADS  // the caller's tuple keeps the inputs alive meanwhile
  status = self->run_torch(self->model, inputs.data(), static_cast<int64_t>(nargs), outputs.data(),
                           self->num_outputs);
  if (status != 0 && status != kNotPlain) message = self->last_error();  // thread-local: read it here
  Py_END_ALLOW_THREADS
  leave(self);
  if (status == kNotPlain) Py_RETURN_NONE;
  if (status != 0) {  // decoded as the ctypes path does: invalid UTF-8 replaced, not raised
    if (message.empty()) message = "unknown runtime error";
    PyObject* text = PyUnicode_DecodeUTF8(message.data(), static_cast<Py_ssize_t>(message.size()), "replace");
    if (text != nullptr) {
      PyErr_SetObject(self->error_type, text);
      Py_DECREF(text);
    }
    return nullptr;
  }
  return wrap_outputs(outputs.data(), self->num_outputs);
}

PyObject* runner_enter(Runner* self, PyObject*) {
  if (!enter(self)) return nullptr;
  Py_RETURN_NONE;
}

PyObject* runner_leave(Runner* self, PyObject*) {
  leave(self);
  Py_RETURN_NONE;
}

PyObject* runner_close(Runner* self, PyObject*) {
  bool first;
  Py_BEGIN_ALLOW_THREADS  // running calls need the GIL to finish
  {
    // released before the GIL is taken back: a caller holding the GIL may wait for it
    std::unique_lock<std::mutex> guard(*self->lock);
    first = !self->closing;
    self->closing = true;
    self->idle->wait(guard, [self] { return self->active == 0; });
  }
  Py_END_ALLOW_THREADS
  return PyBool_FromLong(first);
}

int runner_init(Runner* self, PyObject* args, PyObject* kwargs) {
  unsigned long long run_torch, last_error, model;
  long long num_outputs;
  PyObject *error_type, *name;
  static const char* keywords[] = {"run_torch", "last_error", "model", "num_outputs", "error_type",
                                   "name", nullptr};
  if (!PyArg_ParseTupleAndKeywords(args, kwargs, "KKKLOU", const_cast<char**>(keywords), &run_torch,
                                   &last_error, &model, &num_outputs, &error_type, &name))
    return -1;
  if (run_torch == 0 || last_error == 0 || model == 0 || num_outputs < 0) {
    PyErr_SetString(PyExc_ValueError, "Runner: NULL function or model, or negative output count");
    return -1;
  }
  if (self->model != nullptr) {  // one Runner serves one model for its whole life
    PyErr_SetString(PyExc_RuntimeError, "Runner is already initialised");
    return -1;
  }
  self->run_torch = reinterpret_cast<RunTorchFn>(static_cast<uintptr_t>(run_torch));
  self->last_error = reinterpret_cast<LastErrorFn>(static_cast<uintptr_t>(last_error));
  self->model = reinterpret_cast<void*>(static_cast<uintptr_t>(model));
  self->num_outputs = num_outputs;
  Py_INCREF(error_type);
  Py_XSETREF(self->error_type, error_type);
  Py_XSETREF(self->closed_message, PyUnicode_FromFormat("%U is closed", name));
  return self->closed_message != nullptr ? 0 : -1;
}

PyObject* runner_new(PyTypeObject* type, PyObject*, PyObject*) {
  auto* self = reinterpret_cast<Runner*>(type->tp_alloc(type, 0));
  if (self == nullptr) return nullptr;
  self->lock = new std::mutex;
  self->idle = new std::condition_variable;
  return reinterpret_cast<PyObject*>(self);
}

void runner_dealloc(Runner* self) {
  Py_XDECREF(self->error_type);
  Py_XDECREF(self->closed_message);
  delete self->lock;
  delete self->idle;
  PyTypeObject* type = Py_TYPE(self);
  type->tp_free(reinterpret_cast<PyObject*>(self));
  Py_DECREF(type);  // a heap type (PyType_FromSpec): each instance holds a reference
}

PyMethodDef runner_methods[] = {
    {"run", reinterpret_cast<PyCFunction>(reinterpret_cast<void (*)()>(runner_run)), METH_FASTCALL,
     "run(*tensors) -> list of torch.Tensor, or None when an input must go by DLPack"},
    {"enter", reinterpret_cast<PyCFunction>(runner_enter), METH_NOARGS,
     "count one use of the model handle (raises once closed)"},
    {"leave", reinterpret_cast<PyCFunction>(runner_leave), METH_NOARGS, "end a use begun by enter()"},
    {"close", reinterpret_cast<PyCFunction>(runner_close), METH_NOARGS,
     "wait for running calls and refuse new ones; True for the first close"},
    {nullptr, nullptr, 0, nullptr}};

PyType_Slot runner_slots[] = {
    {Py_tp_doc, const_cast<char*>("One loaded model's run path (aotpack.loader).")},
    {Py_tp_new, reinterpret_cast<void*>(runner_new)},
    {Py_tp_init, reinterpret_cast<void*>(runner_init)},
    {Py_tp_dealloc, reinterpret_cast<void*>(runner_dealloc)},
    {Py_tp_methods, runner_methods},
    {0, nullptr}};

PyType_Spec runner_spec = {"_aotpack_binding.Runner", sizeof(Runner), 0, Py_TPFLAGS_DEFAULT, runner_slots};

PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_aotpack_binding",
                          "aotpack.load's per-call path (native/python/binding.cpp)", -1, nullptr,
                          nullptr, nullptr, nullptr, nullptr};

}  // namespace

PyMODINIT_FUNC PyInit__aotpack_binding() {
  PyObject* module = PyModule_Create(&module_def);
  if (module == nullptr) return nullptr;
  PyObject* runner_type = PyType_FromSpec(&runner_spec);
  if (runner_type == nullptr || PyModule_AddObject(module, "Runner", runner_type) < 0) {
    Py_XDECREF(runner_type);
    Py_DECREF(module);
    return nullptr;
  }
  return module;
}
