// The typed ops: one C++ signature each, the dispatcher handle's typed<>() resolved (and
// checked against the registered schema) once in find_typed_op, so a call builds no
// IValue stack and goes straight to the unboxed kernel.
#include "typed_ops.h"

#include <ATen/core/dispatch/Dispatcher.h>

#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>

#include "tensor_handle.h"
#include "util.h"

namespace aotpack::detail {
namespace {

using at::Tensor;
using OptTensor = std::optional<Tensor>;
using Scalars = c10::List<std::optional<c10::Scalar>>;

struct Args {
  const AotpackArg* args;
  const std::string& name;

  const AotpackArg& at(int i, int32_t kind) const {
    if (args[i].kind != kind && !(kind == AOTPACK_ARG_INT && args[i].kind == AOTPACK_ARG_BOOL))
      fail(name + " argument " + std::to_string(i) + ": kind " + std::to_string(args[i].kind) +
           ", expected " + std::to_string(kind));
    return args[i];
  }
  const Tensor& tensor(int i) const { return unwrap(at(i, AOTPACK_ARG_TENSOR).v.tensor); }
  OptTensor opt_tensor(int i) const {
    if (args[i].kind == AOTPACK_ARG_NONE) return std::nullopt;
    return tensor(i);
  }
  int64_t integer(int i) const { return at(i, AOTPACK_ARG_INT).v.i; }
  bool boolean(int i) const { return at(i, AOTPACK_ARG_BOOL).v.i != 0; }
  c10::Scalar scalar(int i) const {
    if (args[i].kind == AOTPACK_ARG_DOUBLE) return args[i].v.d;
    return integer(i);
  }
  c10::IntArrayRef ints(int i) const {
    const AotpackArg& a = at(i, AOTPACK_ARG_INT_LIST);
    return c10::IntArrayRef(a.v.ints, static_cast<size_t>(a.len));
  }
  std::string_view str(int i) const { return at(i, AOTPACK_ARG_STRING).v.str; }
  std::optional<std::string_view> opt_str(int i) const {
    if (args[i].kind == AOTPACK_ARG_NONE) return std::nullopt;
    return str(i);
  }
  Scalars scalars(int i) const {  // Scalar?[]: given as an int or double list
    Scalars list;
    const AotpackArg& a = args[i];
    if (a.kind == AOTPACK_ARG_DOUBLE_LIST) {
      for (int64_t k = 0; k < a.len; ++k) list.push_back(c10::Scalar(a.v.doubles[k]));
    } else {
      for (int64_t k = 0; k < at(i, AOTPACK_ARG_INT_LIST).len; ++k) list.push_back(c10::Scalar(a.v.ints[k]));
    }
    return list;
  }
};

struct TypedOp {
  std::string name;
  int64_t num_args;
  std::function<Tensor(const Args&)> call;
};

template <class Sig>
c10::TypedOperatorHandle<Sig> typed(const char* name, const char* overload) {
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) fail(std::string("unknown operator '") + name + "." + overload + "'");
  return handle->typed<Sig>();
}

// name.overload -> the op with its typed call (the schemas of torch's native_functions.yaml
// and the mkldnn/mkl registrations; typed<>() refuses a signature that does not match).
TypedOp make(const std::string& key) {
  if (key == "aten::addmm.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const c10::Scalar&, const c10::Scalar&)>(
        "aten::addmm", "");
    return {key, 5, [op](const Args& a) { return op.call(a.tensor(0), a.tensor(1), a.tensor(2), a.scalar(3), a.scalar(4)); }};
  }
  if (key == "aten::mm." || key == "aten::bmm.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&)>(key == "aten::mm." ? "aten::mm" : "aten::bmm", "");
    return {key, 2, [op](const Args& a) { return op.call(a.tensor(0), a.tensor(1)); }};
  }
  if (key == "aten::convolution.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const OptTensor&, c10::SymIntArrayRef, c10::SymIntArrayRef,
                           c10::SymIntArrayRef, bool, c10::SymIntArrayRef, c10::SymInt)>("aten::convolution", "");
    return {key, 9, [op](const Args& a) {
              return op.call(a.tensor(0), a.tensor(1), a.opt_tensor(2), c10::fromIntArrayRefSlow(a.ints(3)),
                             c10::fromIntArrayRefSlow(a.ints(4)), c10::fromIntArrayRefSlow(a.ints(5)), a.boolean(6),
                             c10::fromIntArrayRefSlow(a.ints(7)), c10::SymInt(a.integer(8)));
            }};
  }
  if (key == "mkl::_mkl_linear.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, int64_t)>("mkl::_mkl_linear", "");
    return {key, 5, [op](const Args& a) {
              return op.call(a.tensor(0), a.tensor(1), a.tensor(2), a.opt_tensor(3), a.integer(4));
            }};
  }
  if (key == "mkldnn::_linear_pointwise.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const OptTensor&, std::string_view, Scalars,
                           std::optional<std::string_view>)>("mkldnn::_linear_pointwise", "");
    return {key, 6, [op](const Args& a) {
              return op.call(a.tensor(0), a.tensor(1), a.opt_tensor(2), a.str(3), a.scalars(4), a.opt_str(5));
            }};
  }
  if (key == "mkldnn::_linear_pointwise.binary") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const Tensor&, const OptTensor&, std::string_view)>(
        "mkldnn::_linear_pointwise", "binary");
    return {key, 5, [op](const Args& a) {
              return op.call(a.tensor(0), a.tensor(1), a.tensor(2), a.opt_tensor(3), a.str(4));
            }};
  }
  if (key == "mkldnn::_convolution_pointwise.") {
    auto op = typed<Tensor(const Tensor&, const Tensor&, const OptTensor&, c10::IntArrayRef, c10::IntArrayRef,
                           c10::IntArrayRef, int64_t, std::string_view, Scalars, std::optional<std::string_view>)>(
        "mkldnn::_convolution_pointwise", "");
    return {key, 10, [op](const Args& a) {
              return op.call(a.tensor(0), a.tensor(1), a.opt_tensor(2), a.ints(3), a.ints(4), a.ints(5), a.integer(6),
                             a.str(7), a.scalars(8), a.opt_str(9));
            }};
  }
  fail("operator '" + key + "' has no typed call in this runtime (use call_op)");
}

struct Registry {
  std::mutex mutex;
  std::map<std::string, TypedOp*> by_name;
  std::deque<TypedOp> ops;  // never moves existing elements
};

Registry& registry() {
  static Registry* reg = new Registry();  // never destroyed: model code may hold handles
  return *reg;
}

}  // namespace

void* find_typed_op(const std::string& name, const std::string& overload) {
  const std::string key = name + "." + overload;
  Registry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.by_name.find(key);
  if (it != reg.by_name.end()) return it->second;
  reg.ops.push_back(make(key));
  reg.by_name.emplace(key, &reg.ops.back());
  return &reg.ops.back();
}

Tensor call_typed_op(void* handle, const AotpackArg* args, int64_t num_args) {
  if (handle == nullptr) fail("call_typed: NULL operator handle");
  const TypedOp& op = *static_cast<const TypedOp*>(handle);
  if (num_args != op.num_args || args == nullptr)
    fail(op.name + " takes " + std::to_string(op.num_args) + " arguments, got " + std::to_string(num_args));
  return op.call(Args{args, op.name});
}

}  // namespace aotpack::detail
