// AotpackHostV1 over at::Tensor and the c10 dispatcher. Every entry point catches every
// exception and turns it into a status plus a thread-local message (model_abi.h).
#include "host.h"

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>
#include <c10/util/Exception.h>

#include <deque>
#include <map>
#include <mutex>

#include "dtype.h"
#include "device.h"
#include "tensor_handle.h"
#include "typed_ops.h"

namespace aotpack::detail {
namespace {

thread_local std::string t_last_error;

// Runs `body`; maps any exception to status 1 and host_last_error().
template <class Body>
int32_t guarded(Body&& body) noexcept {
  return detail::guarded(t_last_error, std::forward<Body>(body));
}

// ---- operator registry: handles stay valid for the process lifetime ----

struct OpEntry {
  c10::OperatorHandle handle;
  std::string display_name;  // "aten::addmm.out"
};

struct OpRegistry {
  std::mutex mutex;
  std::map<std::string, OpEntry*> by_name;
  std::deque<OpEntry> entries;  // deque: push_back never moves existing elements
};

// Never destroyed: model code may still hold op handles during static destruction.
OpRegistry& registry() {
  static OpRegistry* instance = new OpRegistry();
  return *instance;
}

OpEntry* find_or_register(const std::string& name, const std::string& overload) {
  const std::string display = overload.empty() ? name : name + "." + overload;
  OpRegistry& reg = registry();
  std::lock_guard<std::mutex> lock(reg.mutex);
  auto it = reg.by_name.find(display);
  if (it != reg.by_name.end()) return it->second;
  auto handle = c10::Dispatcher::singleton().findSchema({name, overload});
  if (!handle) fail("unknown operator '" + display + "'");
  reg.entries.push_back({*handle, display});
  reg.by_name.emplace(display, &reg.entries.back());
  return &reg.entries.back();
}

// ---- AotpackArg -> IValue, guided by the schema argument type ----

struct ArgContext {
  const OpEntry& op;
  const c10::Argument& schema_arg;
  size_t index;

  [[noreturn]] void error(const std::string& what) const {
    fail(op.display_name + " argument " + std::to_string(index) + " ('" + schema_arg.name() +
         "'): " + what);
  }
};

// The schema type with one level of Optional[...] removed.
c10::TypePtr value_type(const c10::Argument& arg, bool* optional) {
  const c10::TypePtr& type = arg.type();
  *optional = type->kind() == c10::TypeKind::OptionalType;
  return *optional ? type->castRaw<c10::OptionalType>()->getElementType() : type;
}

template <class T>
const T* list_data(const AotpackArg& arg, const ArgContext& ctx) {
  if (arg.len < 0) ctx.error("negative list length");
  if (arg.len > 0 && arg.v.ints == nullptr) ctx.error("NULL list pointer");
  return reinterpret_cast<const T*>(arg.v.ints);
}

c10::IValue tensor_list(const AotpackArg& arg, const ArgContext& ctx, const c10::TypePtr& type) {
  const AotpackTensor* items = list_data<AotpackTensor>(arg, ctx);
  const auto* list_type = type->castRaw<c10::ListType>();
  bool optional_items =
      list_type && list_type->getElementType()->kind() == c10::TypeKind::OptionalType;
  if (optional_items) {  // Tensor?[]: NULL -> None
    c10::List<std::optional<at::Tensor>> list;
    list.reserve(arg.len);
    for (int64_t i = 0; i < arg.len; ++i)
      list.push_back(items[i] ? std::optional<at::Tensor>(unwrap(items[i])) : std::nullopt);
    return list;
  }
  std::vector<at::Tensor> list;
  list.reserve(arg.len);
  for (int64_t i = 0; i < arg.len; ++i) {
    if (!items[i]) ctx.error("NULL entry " + std::to_string(i) + " in a Tensor[] (not Tensor?[])");
    list.push_back(unwrap(items[i]));
  }
  return list;
}

c10::IValue int_value(const AotpackArg& arg, const ArgContext& ctx, const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::FloatType:
    case c10::TypeKind::SymFloatType: return static_cast<double>(arg.v.i);
    case c10::TypeKind::BoolType:
    case c10::TypeKind::SymBoolType: ctx.error("expects a bool, got an int");
    default: return arg.v.i;  // int, SymInt, Scalar, ...
  }
}

c10::IValue double_value(const AotpackArg& arg, const ArgContext& ctx, const c10::TypePtr& type) {
  switch (type->kind()) {
    case c10::TypeKind::IntType:
    case c10::TypeKind::SymIntType: ctx.error("expects an int, got a double");
    default: return arg.v.d;
  }
}

c10::IValue int_list(const AotpackArg& arg, const ArgContext& ctx, const c10::TypePtr& type) {
  const int64_t* data = list_data<int64_t>(arg, ctx);
  const auto* list_type = type->castRaw<c10::ListType>();
  if (list_type && list_type->getElementType()->kind() == c10::TypeKind::FloatType)
    return std::vector<double>(data, data + arg.len);
  return std::vector<int64_t>(data, data + arg.len);
}

c10::IValue bool_list(const AotpackArg& arg, const ArgContext& ctx) {
  const int64_t* data = list_data<int64_t>(arg, ctx);
  c10::List<bool> list;
  list.reserve(arg.len);
  for (int64_t i = 0; i < arg.len; ++i) list.push_back(data[i] != 0);
  return list;
}

template <class Enum>
Enum enum_value(int64_t code, Enum limit, const ArgContext& ctx, const char* what) {
  if (code < 0 || code >= static_cast<int64_t>(limit))
    ctx.error("invalid " + std::string(what) + " code " + std::to_string(code));
  return static_cast<Enum>(code);
}

const char* checked_string(const AotpackArg& arg, const ArgContext& ctx) {
  if (arg.v.str == nullptr) ctx.error("NULL string");
  return arg.v.str;
}

c10::IValue to_ivalue(const AotpackArg& arg, const ArgContext& ctx) {
  bool optional = false;
  const c10::TypePtr type = value_type(ctx.schema_arg, &optional);
  switch (arg.kind) {
    case AOTPACK_ARG_NONE: return c10::IValue();
    case AOTPACK_ARG_TENSOR:
      return arg.v.tensor ? c10::IValue(unwrap(arg.v.tensor)) : c10::IValue();
    case AOTPACK_ARG_INT: return int_value(arg, ctx, type);
    case AOTPACK_ARG_DOUBLE: return double_value(arg, ctx, type);
    case AOTPACK_ARG_BOOL: return arg.v.i != 0;
    case AOTPACK_ARG_INT_LIST: return int_list(arg, ctx, type);
    case AOTPACK_ARG_DOUBLE_LIST: {
      const double* data = list_data<double>(arg, ctx);
      return std::vector<double>(data, data + arg.len);
    }
    case AOTPACK_ARG_BOOL_LIST: return bool_list(arg, ctx);
    case AOTPACK_ARG_TENSOR_LIST: return tensor_list(arg, ctx, type);
    case AOTPACK_ARG_STRING: return std::string(checked_string(arg, ctx));
    case AOTPACK_ARG_SCALAR_TYPE:
      return enum_value(arg.v.i, c10::ScalarType::NumOptions, ctx, "dtype");
    case AOTPACK_ARG_LAYOUT: return enum_value(arg.v.i, c10::Layout::NumOptions, ctx, "layout");
    case AOTPACK_ARG_DEVICE: return c10::Device(std::string(checked_string(arg, ctx)));
    case AOTPACK_ARG_MEMORY_FORMAT:
      return enum_value(arg.v.i, c10::MemoryFormat::NumOptions, ctx, "memory format");
    default: ctx.error("unknown AotpackArgKind " + std::to_string(arg.kind));
  }
}

// None is only allowed where the schema says Optional (or the argument is a None type).
void check_none_allowed(const c10::IValue& value, const ArgContext& ctx) {
  if (!value.isNone()) return;
  c10::TypeKind kind = ctx.schema_arg.type()->kind();
  if (kind != c10::TypeKind::OptionalType && kind != c10::TypeKind::NoneType)
    ctx.error("None (or a NULL tensor) given for a non-optional argument");
}

torch::jit::Stack build_stack(const OpEntry& op, const AotpackArg* args, int64_t num_args) {
  const auto& schema_args = op.handle.schema().arguments();
  if (num_args < 0 || static_cast<size_t>(num_args) > schema_args.size())
    fail(op.display_name + " takes " + std::to_string(schema_args.size()) + " arguments, got " +
         std::to_string(num_args));
  if (num_args > 0 && args == nullptr) fail(op.display_name + ": NULL argument array");
  torch::jit::Stack stack;
  stack.reserve(schema_args.size());
  for (size_t i = 0; i < schema_args.size(); ++i) {
    ArgContext ctx{op, schema_args[i], i};
    if (i < static_cast<size_t>(num_args)) {
      stack.push_back(to_ivalue(args[i], ctx));
      check_none_allowed(stack.back(), ctx);
    } else if (schema_args[i].default_value()) {  // trailing arguments left to defaults
      stack.push_back(*schema_args[i].default_value());
    } else {
      ctx.error("missing and has no default");
    }
  }
  return stack;
}

// ---- results -> handles ----

// Owns handles until they are handed out, so an error path frees them.
struct HandleList {
  std::vector<AotpackTensor> handles;
  ~HandleList() {
    for (AotpackTensor h : handles) release_handle(h);
  }
  void add_tensor(const at::Tensor& t) { handles.push_back(t.defined() ? new_handle(t) : nullptr); }
};

void flatten_result(const c10::IValue& value, const OpEntry& op, HandleList& out) {
  if (value.isTensor()) return out.add_tensor(value.toTensor());
  if (value.isNone()) return out.handles.push_back(nullptr);
  if (value.isTensorList()) {
    for (const at::Tensor& t : value.toTensorVector()) out.add_tensor(t);
    return;
  }
  if (value.isList()) {  // e.g. Tensor?[]
    for (const c10::IValue& item : value.toListRef()) {
      if (!item.isTensor() && !item.isNone())
        fail(op.display_name + " returned a list of " + item.tagKind() + ", not of tensors");
      flatten_result(item, op, out);
    }
    return;
  }
  fail(op.display_name + " returned a " + value.tagKind() +
       "; only Tensor, Tensor[], Tensor?[] and None results are supported");
}

void hand_out(const OpEntry& op, const torch::jit::Stack& results, AotpackTensor* outs,
              int64_t num_outs) {
  HandleList list;
  for (const c10::IValue& value : results) flatten_result(value, op, list);
  if (static_cast<int64_t>(list.handles.size()) != num_outs)
    fail(op.display_name + " returned " + std::to_string(list.handles.size()) +
         " tensor(s), the caller expected " + std::to_string(num_outs));
  if (num_outs > 0 && outs == nullptr) fail(op.display_name + ": NULL output array");
  for (int64_t i = 0; i < num_outs; ++i) outs[i] = list.handles[i];
  list.handles.clear();
}

// ---- the host functions ----

// The caller's array, checked, without a copy (valid for the call it came with).
c10::IntArrayRef dims(int64_t ndim, const int64_t* values, const char* what) {
  if (ndim < 0) fail(std::string("negative ndim for ") + what);
  if (ndim > 0 && values == nullptr) fail(std::string("NULL ") + what);
  return c10::IntArrayRef(values, static_cast<size_t>(ndim));
}

c10::ScalarType scalar_type(int32_t code) {
  if (code < 0 || code >= static_cast<int32_t>(c10::ScalarType::NumOptions) ||
      code == static_cast<int32_t>(c10::ScalarType::Undefined))
    fail("invalid dtype code " + std::to_string(code));
  return static_cast<c10::ScalarType>(code);
}

int32_t host_find_op(const char* name, const char* overload, void** op_out) {
  return guarded([&] {
    if (name == nullptr || op_out == nullptr) fail("find_op: NULL name or output pointer");
    *op_out = find_or_register(name, overload ? overload : "");
  });
}

int32_t host_call_op(void* op, const AotpackArg* args, int64_t num_args, AotpackTensor* outs,
                     int64_t num_outs) {
  for (int64_t i = 0; outs != nullptr && i < num_outs; ++i) outs[i] = nullptr;
  return guarded([&] {
    if (op == nullptr) fail("call_op: NULL operator handle");
    const OpEntry& entry = *static_cast<const OpEntry*>(op);
    torch::jit::Stack stack = build_stack(entry, args, num_args);
    try {
      entry.handle.callBoxed(stack);
    } catch (const std::exception& e) {
      fail(entry.display_name + " failed: " + exception_message(e));
    }
    hand_out(entry, stack, outs, num_outs);
  });
}

int32_t host_empty_strided(int64_t ndim, const int64_t* sizes, const int64_t* strides,
                           int32_t dtype, AotpackTensor* out) {
  return guarded([&] {
    if (out == nullptr) fail("empty_strided: NULL output pointer");
    const c10::IntArrayRef size_v = dims(ndim, sizes, "sizes");
    const c10::IntArrayRef stride_v = dims(ndim, strides, "strides");
    const c10::ScalarType type = scalar_type(dtype);
    *out = new_handle(host_device().empty_strided(size_v, stride_v, type));
  });
}

int32_t host_as_strided(AotpackTensor base, int64_t ndim, const int64_t* sizes,
                        const int64_t* strides, int64_t offset, AotpackTensor* out) {
  return guarded([&] {
    if (out == nullptr) fail("as_strided: NULL output pointer");
    const at::Tensor& b = unwrap(base);
    *out = new_handle(b.as_strided(dims(ndim, sizes, "sizes"), dims(ndim, strides, "strides"),
                                   b.storage_offset() + offset));
  });
}

int32_t host_data_ptr(AotpackTensor t, void** out) {
  return guarded([&] {
    if (out == nullptr) fail("data_ptr: NULL output pointer");
    *out = unwrap(t).data_ptr();
  });
}

std::string layout_string(c10::ScalarType dtype, c10::IntArrayRef sizes, c10::IntArrayRef strides) {
  return describe(dtype, sizes.vec()) + " strides " + format_ints(strides.vec());
}

int32_t host_check_layout(AotpackTensor t, int64_t ndim, const int64_t* sizes,
                          const int64_t* strides, int32_t dtype) {
  return guarded([&] {
    const at::Tensor& tensor = unwrap(t);
    const c10::IntArrayRef want_sizes = dims(ndim, sizes, "sizes");
    const c10::IntArrayRef want_strides = dims(ndim, strides, "strides");
    bool same = tensor.scalar_type() == scalar_type(dtype) && tensor.sizes().equals(want_sizes);
    for (int64_t d = 0; same && d < ndim; ++d)
      same = want_sizes[d] == 1 || tensor.stride(d) == want_strides[d];
    if (!same)
      fail("layout mismatch: expected " +
           layout_string(scalar_type(dtype), want_sizes, want_strides) + ", got " +
           layout_string(tensor.scalar_type(), tensor.sizes(), tensor.strides()));
  });
}

int32_t host_copy(AotpackTensor dst, AotpackTensor src) {
  return guarded([&] { unwrap(dst).copy_(unwrap(src)); });
}

void host_release(AotpackTensor t) { release_handle(t); }

int32_t host_find_typed(const char* name, const char* overload, void** op_out) {
  return guarded([&] {
    if (name == nullptr || op_out == nullptr) fail("find_typed: NULL name or output pointer");
    *op_out = find_typed_op(name, overload ? overload : "");
  });
}

int32_t host_call_typed(void* op, const AotpackArg* args, int64_t num_args, AotpackTensor* out) {
  if (out != nullptr) *out = nullptr;
  return guarded([&] {
    if (out == nullptr) fail("call_typed: NULL output pointer");
    *out = new_handle(call_typed_op(op, args, num_args));
  });
}

const AotpackHostV1 kHostTable = {
    AOTPACK_HOST_ABI_VERSION,
    sizeof(AotpackHostV1),
    host_find_op,
    host_call_op,
    host_empty_strided,
    host_as_strided,
    host_data_ptr,
    host_check_layout,
    host_copy,
    host_release,
    host_last_error,
    host_find_typed,
    host_call_typed,
};

}  // namespace

std::string exception_message(const std::exception& e) {
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e))
    return c10_error->what_without_backtrace();
  return e.what();
}

const AotpackHostV1* host_table() { return &kHostTable; }

const char* host_last_error() { return t_last_error.c_str(); }

}  // namespace aotpack::detail
