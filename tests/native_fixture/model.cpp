// Hand-written model.so for the native runtime tests (stands in for generated
// code).
//
//   y     = relu(x @ w + b)       x: float32[4, 8], w: float32[8, 16] with
//   strides [1, 8] calls += 1; output a copy     calls: int64[1], a mutated
//   buffer
//
// It reaches libtorch only through the AotpackHostV1 table, like generated code
// must. Build: g++ -O2 -shared -fPIC -std=c++17 -I native/include model.cpp -o
// model.so
#include <new>
#include <string>

#include "aotpack/model_abi.h"

namespace {

constexpr int64_t kBatch = 4, kIn = 8, kOut = 16;

thread_local std::string g_error;

struct Model {
  const AotpackHostV1 *host;
  AotpackTensor w, b, calls; // borrowed constants
  void *addmm;
  void *relu;
  void *add_;
  void *clone;
};

// Records "<step>: <host message>" and returns the error status.
int32_t fail(const AotpackHostV1 *host, const char *step) {
  g_error = std::string(step) + ": " + host->last_error();
  return 1;
}

AotpackArg tensor_arg(AotpackTensor t) {
  AotpackArg a{};
  a.kind = AOTPACK_ARG_TENSOR;
  a.v.tensor = t;
  return a;
}

AotpackArg int_arg(int64_t i) {
  AotpackArg a{};
  a.kind = AOTPACK_ARG_INT;
  a.v.i = i;
  return a;
}

AotpackArg none_arg() {
  AotpackArg a{};
  a.kind = AOTPACK_ARG_NONE;
  return a;
}

int32_t check_constants(const Model &m) {
  const int64_t w_sizes[] = {kIn, kOut}, w_strides[] = {1, kIn};
  const int64_t b_sizes[] = {kOut}, one[] = {1};
  if (m.host->check_layout(m.w, 2, w_sizes, w_strides, AOTPACK_DTYPE_FLOAT32))
    return fail(m.host, "w");
  if (m.host->check_layout(m.b, 1, b_sizes, one, AOTPACK_DTYPE_FLOAT32))
    return fail(m.host, "b");
  if (m.host->check_layout(m.calls, 1, one, one, AOTPACK_DTYPE_INT64))
    return fail(m.host, "calls");
  return 0;
}

int32_t find_ops(Model &m) {
  if (m.host->find_op("aten::addmm", "", &m.addmm))
    return fail(m.host, "find addmm");
  if (m.host->find_op("aten::relu", "", &m.relu))
    return fail(m.host, "find relu");
  if (m.host->find_op("aten::add_", "Scalar", &m.add_))
    return fail(m.host, "find add_");
  if (m.host->find_op("aten::clone", "", &m.clone))
    return fail(m.host, "find clone");
  return 0;
}

// y = relu(addmm(b, x, w)); the intermediate handle is released.
int32_t linear_relu(const Model &m, AotpackTensor x, AotpackTensor *y) {
  const AotpackArg args[] = {tensor_arg(m.b), tensor_arg(x), tensor_arg(m.w),
                             int_arg(1), int_arg(1)};
  AotpackTensor linear = nullptr;
  if (m.host->call_op(m.addmm, args, 5, &linear, 1))
    return fail(m.host, "addmm");
  const AotpackArg relu_args[] = {tensor_arg(linear)};
  int32_t rc = m.host->call_op(m.relu, relu_args, 1, y, 1);
  m.host->release(linear);
  return rc ? fail(m.host, "relu") : 0;
}

// calls += 1 in place (alpha left to its schema default), then a copy as the
// output.
int32_t count_call(const Model &m, AotpackTensor *out) {
  const AotpackArg add_args[] = {tensor_arg(m.calls), int_arg(1)};
  AotpackTensor self = nullptr;
  if (m.host->call_op(m.add_, add_args, 2, &self, 1))
    return fail(m.host, "add_");
  m.host->release(self);
  const AotpackArg clone_args[] = {tensor_arg(m.calls), none_arg()};
  return m.host->call_op(m.clone, clone_args, 2, out, 1) ? fail(m.host, "clone")
                                                         : 0;
}

} // namespace

extern "C" {

__attribute__((visibility("default"))) int32_t aotpack_model_abi_version(void) {
  return AOTPACK_MODEL_ABI_VERSION;
}

__attribute__((visibility("default"))) int32_t
aotpack_model_create(const AotpackHostV1 *host, const char *root_dir,
                     const AotpackTensor *constants, int64_t num_constants,
                     int32_t device_limit, void **model_out) {
  if (host == nullptr ||
      (host->host_abi_version >> 16) != AOTPACK_HOST_ABI_VERSION_MAJOR ||
      host->struct_size < sizeof(AotpackHostV1)) {
    g_error = "incompatible host table";
    return 1;
  }
  if (num_constants != 3) {
    g_error = "expected 3 constants (w, b, calls), got " +
              std::to_string(num_constants);
    return 1;
  }
  Model *m =
      new (std::nothrow) Model{host, constants[0], constants[1], constants[2]};
  if (m == nullptr) {
    g_error = "out of memory";
    return 1;
  }
  if (check_constants(*m) || find_ops(*m)) {
    delete m;
    return 1;
  }
  *model_out = m;
  return 0;
}

__attribute__((visibility("default"))) int32_t
aotpack_model_run(void *model, const AotpackTensor *inputs, int64_t num_inputs,
                  AotpackTensor *outputs, int64_t num_outputs) {
  const Model &m = *static_cast<const Model *>(model);
  if (num_inputs != 1 || num_outputs != 2) {
    g_error = "expected 1 input and 2 outputs";
    return 1;
  }
  const int64_t x_sizes[] = {kBatch, kIn}, x_strides[] = {kIn, 1};
  if (m.host->check_layout(inputs[0], 2, x_sizes, x_strides,
                           AOTPACK_DTYPE_FLOAT32))
    return fail(m.host, "x");
  if (linear_relu(m, inputs[0], &outputs[0]))
    return 1;
  if (count_call(m, &outputs[1])) {
    m.host->release(outputs[0]);
    outputs[0] = nullptr;
    return 1;
  }
  return 0;
}

__attribute__((visibility("default"))) void aotpack_model_destroy(void *model) {
  delete static_cast<Model *>(model);
}

__attribute__((visibility("default"))) const char *
aotpack_model_last_error(void) {
  return g_error.c_str();
}

} // extern "C"
