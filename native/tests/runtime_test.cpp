// Unit tests of the runtime's parts that need no archive: paths, .npy, safetensors, manifest,
// CPU features, the host table, the temp folder. End-to-end tests over a real archive are in
// tests/native/test_native_runtime.py. Exit status 0 when every check passes.
#include <ATen/ops/allclose.h>
#include <ATen/ops/arange.h>
#include <ATen/ops/equal.h>
#include <ATen/ops/full_like.h>
#include <ATen/ops/ones.h>

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>
#include <vector>
#include <nlohmann/json.hpp>

#include "../src/archive.h"
#include "../src/compat.h"
#include "../src/device.h"
#include "../src/devices/cpu/core_runner.h"
#include "../src/devices/cpu/cores.h"
#include "../src/devices/cpu/cpu_features.h"
#include "../src/devices/cpu/elf_check.h"
#include "../src/extract.h"
#include "../src/sha256.h"
#include "../src/host.h"
#include "../src/devices/cpu/host_pool.h"
#include "../src/manifest.h"
#include "../src/npy.h"
#include "../src/safetensors.h"
#include "../src/tempdir.h"
#include "../src/tensor_handle.h"
#include "aotpack/archive_layout.h"
#include "aotpack/env_vars.h"
#include "aotpack/kernel_abi.h"
#include "aotpack/runtime.h"
#include "npy.h"

namespace {

int g_failures = 0, g_checks = 0;

#define EXPECT(cond)                                                       \
  do {                                                                     \
    ++g_checks;                                                            \
    if (!(cond)) {                                                         \
      ++g_failures;                                                        \
      std::fprintf(stderr, "FAIL %s:%d: %s\n", __FILE__, __LINE__, #cond); \
    }                                                                      \
  } while (0)

// Runs `body`, expecting an exception whose message contains `needle`.
void check_throws(const char* file, int line, const std::function<void()>& body,
                  const std::string& needle) {
  ++g_checks;
  try {
    body();
  } catch (const std::exception& e) {
    std::string message = aotpack::detail::exception_message(e);
    if (message.find(needle) != std::string::npos) return;
    ++g_failures;
    std::fprintf(stderr, "FAIL %s:%d: message '%s' lacks '%s'\n", file, line, message.c_str(),
                 needle.c_str());
    return;
  }
  ++g_failures;
  std::fprintf(stderr, "FAIL %s:%d: no exception (expected '%s')\n", file, line, needle.c_str());
}
#define EXPECT_THROWS(body, needle) check_throws(__FILE__, __LINE__, [&] { body; }, needle)

using aotpack::detail::borrow_handle;
using aotpack::detail::take_handle;

// ---- archive paths ----

void test_entry_paths() {
  aotpack::detail::check_entry_path(AOTPACK_MODEL_LIBRARY_PATH);
  aotpack::detail::check_entry_path(AOTPACK_KERNELS_DIR "/k0/" AOTPACK_STATIC_KERNEL_DIR
                                    "/abc/" AOTPACK_LIB_KERNEL_NAME);
  EXPECT_THROWS(aotpack::detail::check_entry_path("/etc/passwd"), "absolute path");
  EXPECT_THROWS(aotpack::detail::check_entry_path("../evil"), "'..' component");
  EXPECT_THROWS(aotpack::detail::check_entry_path("a/../../b"), "'..' component");
  EXPECT_THROWS(aotpack::detail::check_entry_path("a//b"), "not a normalised");
  EXPECT_THROWS(aotpack::detail::check_entry_path("./a"), "not a normalised");
  EXPECT_THROWS(aotpack::detail::check_entry_path(""), "empty path");
  EXPECT_THROWS(aotpack::detail::check_entry_path("a\\..\\b"), "backslash");
}

// ---- .npy ----

void test_npy_round_trip() {
  const std::vector<c10::ScalarType> types = {
      c10::ScalarType::Float, c10::ScalarType::Double, c10::ScalarType::Half,
      c10::ScalarType::Long,  c10::ScalarType::Int,    c10::ScalarType::Short,
      c10::ScalarType::Char,  c10::ScalarType::Byte,   c10::ScalarType::Bool};
  for (c10::ScalarType type : types) {
    for (const std::vector<int64_t>& shape : {std::vector<int64_t>{}, {5}, {2, 3}, {0, 4}}) {
      int64_t numel = 1;
      for (int64_t d : shape) numel *= d;
      std::string data(numel * c10::elementSize(type), '\x01');
      const std::string file = aotpack::npy::encode(type, shape, data.data(), data.size());
      EXPECT((file.size() - data.size()) % 64 == 0);  // data is 64-byte aligned
      const at::Tensor back = aotpack::npy::parse(file, "t.npy");
      EXPECT(back.scalar_type() == type && back.sizes().vec() == shape && back.is_contiguous() &&
             std::memcmp(back.data_ptr(), data.data(), data.size()) == 0);
    }
  }
}

std::string npy_with_header(const std::string& dict, size_t data_bytes) {
  std::string header = dict + "\n";
  std::string file = std::string("\x93NUMPY\x01\x00", 8);
  file += static_cast<char>(header.size() & 0xff);
  file += static_cast<char>(header.size() >> 8);
  return file + header + std::string(data_bytes, '\0');
}

void test_npy_errors() {
  EXPECT_THROWS(aotpack::npy::parse("hello", "a.npy"), "a.npy: not a .npy file");
  // column-major data is accepted and transposed into row-major
  std::string fortran = npy_with_header("{'descr': '<i1', 'fortran_order': True, 'shape': (2, 3), }", 0);
  fortran += std::string("\x00\x03\x01\x04\x02\x05", 6);  // column by column
  const at::Tensor rows = aotpack::npy::parse(fortran, "f.npy");
  EXPECT(rows.is_contiguous() && at::equal(rows, at::arange(6, at::kChar).reshape({2, 3})));
  EXPECT_THROWS(
      aotpack::npy::parse(
          npy_with_header("{'descr': '>f4', 'fortran_order': False, 'shape': (2,), }", 8), "b.npy"),
      "big-endian");
  EXPECT_THROWS(
      aotpack::npy::parse(
          npy_with_header("{'descr': '<c8', 'fortran_order': False, 'shape': (2,), }", 16),
          "c.npy"),
      "unsupported dtype '<c8'");
  EXPECT_THROWS(
      aotpack::npy::parse(
          npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (3,), }", 8), "s.npy"),
      "holds 8 data bytes");
  EXPECT_THROWS(
      aotpack::npy::parse(npy_with_header("{'descr': '<f4', 'shape': (2,), }", 8), "m.npy"),
      "missing");
  const auto ok = aotpack::npy::parse(
      npy_with_header("{\"descr\": \"|u1\", \"fortran_order\": False, \"shape\": (3,)}", 3),
      "ok.npy");
  EXPECT(ok.scalar_type() == c10::ScalarType::Byte && ok.sizes().vec() == std::vector<int64_t>{3});
  EXPECT_THROWS(aotpack::npy::encode(c10::ScalarType::BFloat16, {1}, "ab", 2),
                "no .npy equivalent");
}

// ---- safetensors ----

std::string safetensors_file(const nlohmann::json& header, const std::string& data) {
  const std::string text = header.dump();
  std::string file;
  for (int i = 0; i < 8; ++i) file += static_cast<char>((text.size() >> (8 * i)) & 0xff);
  return file + text + data;
}

void test_safetensors() {
  nlohmann::json header = {{"__metadata__", {{"k", "v"}}},
                           {"a", {{"dtype", "F32"}, {"shape", {2}}, {"data_offsets", {0, 8}}}},
                           {"m", {{"dtype", "BOOL"}, {"shape", {3}}, {"data_offsets", {8, 11}}}}};
  const std::string file = safetensors_file(header, std::string(11, '\x02'));
  const auto views = aotpack::detail::parse_safetensors(file);
  EXPECT(views.size() == 2);
  EXPECT(views.at("a").dtype == c10::ScalarType::Float && views.at("a").nbytes == 8);
  EXPECT(views.at("m").dtype == c10::ScalarType::Bool &&
         views.at("m").shape == std::vector<int64_t>{3});

  header["a"]["data_offsets"] = {0, 12};
  EXPECT_THROWS(aotpack::detail::parse_safetensors(safetensors_file(header, std::string(11, 0))),
                "outside the file");
  header["a"]["data_offsets"] = {0, 4};
  EXPECT_THROWS(aotpack::detail::parse_safetensors(safetensors_file(header, std::string(11, 0))),
                "needs 8");
  header["a"] = {{"dtype", "C64"}, {"shape", {1}}, {"data_offsets", {0, 8}}};
  EXPECT_THROWS(aotpack::detail::parse_safetensors(safetensors_file(header, std::string(11, 0))),
                "'C64'");
  EXPECT_THROWS(
      aotpack::detail::parse_safetensors(std::string("\xff\xff\x00\x00\x00\x00\x00\x00{}", 10)),
      "header length exceeds");
  EXPECT_THROWS(aotpack::detail::parse_safetensors("abc"), "shorter");
}

// ---- manifest ----

nlohmann::json minimal_manifest() {
  return {
      {"format_version", AOTPACK_FORMAT_VERSION},
      {"name", "m"},
      {"version", "1.0.0"},
      {"torch_version", "2.13.0"},
      {"backend", "cpu"},
      {"target_isa", {{"march", "x86-64"}, {"features", nlohmann::json::array()}}},
      {"model", {{"library", AOTPACK_MODEL_LIBRARY_PATH}, {"abi_version", AOTPACK_MODEL_ABI_VERSION_MAJOR}}},
      {"constants", nlohmann::json::array()},
      {"inputs", {{{"name", "x"}, {"dtype", "float32"}, {"shape", {2, 3}}, {"strides", {3, 1}}}}},
      {"outputs", nlohmann::json::array()},
      {"files", {{AOTPACK_MODEL_LIBRARY_PATH, {{"sha256", std::string(64, 'a')}, {"size", 3}}}}}};
}

void test_manifest() {
  const auto m = aotpack::detail::parse_manifest(minimal_manifest().dump());
  EXPECT(m.name == "m" && m.inputs.size() == 1 && m.inputs[0].dtype == c10::ScalarType::Float);
  EXPECT(m.inputs[0].strides == (std::vector<int64_t>{3, 1}));

  auto j = minimal_manifest();
  j["format_version"] = AOTPACK_FORMAT_VERSION + 1;
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()),
                "format_version " + std::to_string(AOTPACK_FORMAT_VERSION + 1) + " is not supported");
  j["format_version"] = 1;  // before the versioned kernel launch ABI
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()),
                "format_version 1 is not supported (this runtime reads " +
                    std::to_string(AOTPACK_FORMAT_VERSION) +
                    "): the archive is from an older aotpack (before the versioned kernel launch "
                    "ABI); rebuild it with this aotpack");
  j["format_version"] = 2;  // before weight aliases
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()),
                "format_version 2 is not supported (this runtime reads " +
                    std::to_string(AOTPACK_FORMAT_VERSION) +
                    "): the archive is from an older aotpack (before weight aliases); rebuild it with "
                    "this aotpack");
  j = minimal_manifest();
  j.erase("name");
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), AOTPACK_MANIFEST_PATH ": name: missing");
  j = minimal_manifest();
  j["inputs"][0]["dtype"] = "complex64";
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()),
                "inputs[0].dtype: unknown dtype 'complex64'");
  j = minimal_manifest();
  j["inputs"][0]["strides"] = {1};
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "differ in length");
  EXPECT_THROWS(aotpack::detail::parse_manifest("{not json"), "not valid JSON");

  // one reader's rules (docs/archive.md): the Python reader refuses the same
  j = minimal_manifest();
  j["files"]["model/model.so"]["sha256"] = std::string(64, 'A');
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "not a 64-digit lower-case hex digest");
  j = minimal_manifest();
  j["files"] = nlohmann::json::array();
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "manifest.json: files: expected an object");
  j = minimal_manifest();
  j["files"]["../evil"] = {{"sha256", std::string(64, 'a')}, {"size", 1}};
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "'..' component");
  j = minimal_manifest();
  j["files"]["manifest.sig"] = {{"sha256", std::string(64, 'a')}, {"size", 1}};
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "manifest entries cannot be listed");
  j = minimal_manifest();
  j["model"]["library"] = "model/other.so";
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "is not one of the archive's files");
  j = minimal_manifest();
  j["files"]["model/model.so"]["size"] = 18446744073709551615ull;
  EXPECT_THROWS(aotpack::detail::parse_manifest(j.dump()), "size: expected an integer");
  EXPECT_THROWS(aotpack::detail::parse_manifest("null"), "expected a JSON object");
  EXPECT_THROWS(aotpack::detail::parse_manifest("[1]"), "expected a JSON object");
  EXPECT_THROWS(aotpack::detail::parse_manifest("\xef\xbb\xbf{}"), "byte-order mark");
  EXPECT_THROWS(aotpack::detail::parse_manifest(std::string(100000, '[')), "nests deeper than 64");
  EXPECT_THROWS(aotpack::detail::parse_manifest(std::string("{\0\"\0", 4)), "not valid JSON");

  // limits, checked on the manifest before anything is read
  aotpack::detail::Limits limits;
  limits.max_entries = 3;
  const auto parsed = aotpack::detail::parse_manifest(minimal_manifest().dump());
  EXPECT_THROWS(aotpack::detail::check_limits(parsed, limits), "AOTPACK_MAX_ENTRIES");
  limits = {};
  limits.max_entry_bytes = 2;
  EXPECT_THROWS(aotpack::detail::check_limits(parsed, limits), "AOTPACK_MAX_ENTRY_BYTES");
  limits = {};
  limits.max_total_bytes = 2;
  EXPECT_THROWS(aotpack::detail::check_limits(parsed, limits), "AOTPACK_MAX_TOTAL_BYTES");
  aotpack::detail::check_limits(parsed, aotpack::detail::Limits{});

  // the manifest digest and signatures
  const std::string text = minimal_manifest().dump();
  const std::string digest = aotpack::detail::sha256_hex(text) + "\n";
  aotpack::detail::check_manifest_entries(text, digest, "", {}, aotpack::detail::Limits{});
  EXPECT_THROWS(aotpack::detail::check_manifest_entries(text + " ", digest, "", {}, {}),
                "does not match manifest.sha256");
  EXPECT_THROWS(aotpack::detail::check_manifest_entries(text, digest, "", {"/nonexistent.pem"}, {}),
                "the archive is not signed");
  EXPECT_THROWS(aotpack::detail::check_manifest_entries(text, digest, std::string(64, 'x'),
                                                        {"/nonexistent.pem"}, {}),
                "cannot read trusted key '/nonexistent.pem'");
}

// ---- ELF check before dlopen ----

void test_elf_check() {
  namespace fs = std::filesystem;
  auto dir = aotpack::detail::TempDir::create();
  const std::string good = dir.path() + "/good.so", cut = dir.path() + "/cut.so";
  fs::copy_file("/proc/self/exe", good);  // a PIE: ET_DYN like any .so
  aotpack::detail::check_elf(good, "good.so");
  fs::copy_file(good, cut);
  fs::resize_file(cut, fs::file_size(good) - 100);  // section headers are at the end
  EXPECT_THROWS(aotpack::detail::check_elf(cut, "cut.so"),
                "cut.so is not a valid shared object for this host");
  fs::resize_file(cut, 4000);
  EXPECT_THROWS(aotpack::detail::check_elf(cut, "cut.so"), "outside the file");
  fs::resize_file(cut, 10);
  EXPECT_THROWS(aotpack::detail::check_elf(cut, "cut.so"), "shorter than an ELF header");
  dir.write_file("text.so", std::string(200, 'x'), 0644);
  EXPECT_THROWS(aotpack::detail::check_elf(dir.path() + "/text.so", "text.so"), "no ELF magic");
}

// ---- cores ----

void test_cores() {
  const int32_t cores = aotpack::detail::available_cores();
  EXPECT(cores >= 1);
  aotpack::detail::check_device_limit(0);
  aotpack::detail::check_device_limit(cores);
  EXPECT_THROWS(aotpack::detail::check_device_limit(cores + 1),
                "device limit " + std::to_string(cores + 1) + " exceeds the " +
                    std::to_string(cores) + " cores available");
}

// ---- compatibility ----

void test_compat() {
  EXPECT(aotpack::detail::missing_cpu_features({"sse2", "SSE2"}).empty());
  const auto missing = aotpack::detail::missing_cpu_features({"warp9"});
  EXPECT(missing.size() == 1 && missing[0].find("unknown feature name") != std::string::npos);
  for (const char* alias : {"sse4_2", "sse4.2", "avx512_vnni", "avx512vnni"}) {
    const auto m = aotpack::detail::missing_cpu_features({alias});
    EXPECT(m.empty() || m[0].find("unknown") == std::string::npos);
  }
  auto manifest = aotpack::detail::parse_manifest(minimal_manifest().dump());
  manifest.torch_version = "1.13.1";
  EXPECT_THROWS(aotpack::detail::check_compatibility(manifest), "built with torch 1.13.1");
  manifest = aotpack::detail::parse_manifest(minimal_manifest().dump());
  manifest.backend = "npu";
  EXPECT_THROWS(aotpack::detail::check_compatibility(manifest), "backend 'npu'");
  manifest = aotpack::detail::parse_manifest(minimal_manifest().dump());
  manifest.isa_features = {"warp9"};
  EXPECT_THROWS(aotpack::detail::check_compatibility(manifest), "'warp9' (unknown feature name");
  manifest = aotpack::detail::parse_manifest(minimal_manifest().dump());
  manifest.model_abi_version = 1;
  EXPECT_THROWS(aotpack::detail::check_compatibility(manifest),
                "model.abi_version 1 is not supported (this runtime implements model ABI 2.0; the "
                "major must match)");
}

// ---- device registry ----

void test_device_registry() {
  using aotpack::detail::device_for_backend;
  const aotpack::detail::Device& cpu = device_for_backend("cpu");
  EXPECT(&cpu == &device_for_backend("cpu"));  // one device per process
  EXPECT(&cpu == &aotpack::detail::host_device());
  EXPECT((aotpack::detail::backend_names() == std::vector<std::string>{"cpu", "portable"}));
  EXPECT(&device_for_backend("portable") == &cpu);  // host ELF objects: the CPU device runs them
  EXPECT(cpu.compute_units() == aotpack::detail::available_cores());
  EXPECT(cpu.is_binary("kernels/k0/wrapper.so") && !cpu.is_binary("weights/weights.safetensors"));
  EXPECT_THROWS(device_for_backend("npu"),
                "backend 'npu' is not supported (this runtime runs 'cpu', 'portable' archives)");
  EXPECT_THROWS(device_for_backend("CPU"), "backend 'CPU' is not supported");  // names are exact
  EXPECT_THROWS(device_for_backend(""), "backend '' is not supported");
  // The registry's device is the one check_compatibility hands the load.
  auto manifest = aotpack::detail::parse_manifest(minimal_manifest().dump());
  EXPECT(&aotpack::detail::check_compatibility(manifest) == &cpu);
  manifest.isa_features = {"warp9"};
  EXPECT_THROWS(cpu.check_target(manifest),
                "this CPU lacks 'warp9' (unknown feature name, treated as unsupported) required by "
                "target_isa");
  // A partition runs calls on its own thread, on its units.
  const std::vector<int32_t> one = {aotpack::detail::allowed_cores().front()};
  auto partition = cpu.partition(one);
  EXPECT(partition->units() == one);
  std::thread::id ran_on;
  partition->call([&] { ran_on = std::this_thread::get_id(); });
  EXPECT(ran_on != std::this_thread::get_id());
  EXPECT_THROWS(partition->call([] { aotpack::detail::fail("inside"); }), "inside");
  at::Tensor t = cpu.empty_strided({2, 3}, {1, 2}, at::kFloat);
  EXPECT(t.sizes() == at::IntArrayRef({2, 3}) && t.strides() == at::IntArrayRef({1, 2}) &&
         t.scalar_type() == at::kFloat);
  cpu.synchronize();
}

// ---- ABI versions ----

void test_abi_versions() {
  EXPECT(aotpack::detail::abi_version_text(AOTPACK_MODEL_ABI_VERSION) == "2.0");
  EXPECT(aotpack::detail::abi_version_text((3 << 16) | 7) == "3.7");
  EXPECT(AOTPACK_KERNEL_ABI_VERSION == (1 << 16));
  // a model.so of another MINOR is accepted, another MAJOR refused naming both versions
  aotpack::detail::check_model_abi("model/model.so", AOTPACK_MODEL_ABI_VERSION + 5);
  EXPECT_THROWS(aotpack::detail::check_model_abi("model/model.so", (1 << 16) | 3),
                "model/model.so implements model ABI 1.3, this runtime implements 2.0 (the major "
                "must match); rebuild the archive with this aotpack");
  const AotpackHostV1& table = *aotpack::detail::host_table();
  EXPECT(table.host_abi_version == AOTPACK_HOST_ABI_VERSION);
  EXPECT(table.struct_size == sizeof(AotpackHostV1));
  // the launch struct: struct_size first, 1.0 fields through max_threads
  EXPECT(offsetof(AotpackKernelLaunch, struct_size) == 0);
  EXPECT(AOTPACK_KERNEL_LAUNCH_V1_SIZE == offsetof(AotpackKernelLaunch, max_threads) + 4);
  EXPECT(sizeof(AotpackKernelLaunch) >= AOTPACK_KERNEL_LAUNCH_V1_SIZE);
}

// ---- host table ----

const AotpackHostV1& host() { return *aotpack::detail::host_table(); }

void* op(const char* name, const char* overload) {
  void* handle = nullptr;
  if (host().find_op(name, overload, &handle) != 0)
    std::fprintf(stderr, "find_op: %s\n", host().last_error());
  return handle;
}

AotpackArg targ(const at::Tensor& t) {
  AotpackArg a{};
  a.kind = AOTPACK_ARG_TENSOR;
  a.v.tensor = borrow_handle(t);
  return a;
}

AotpackArg iarg(int32_t kind, int64_t i) {
  AotpackArg a{};
  a.kind = kind;
  a.v.i = i;
  return a;
}

AotpackArg list_arg(int32_t kind, const void* items, int64_t len) {
  AotpackArg a{};
  a.kind = kind;
  a.len = len;
  a.v.ints = static_cast<const int64_t*>(items);
  return a;
}

at::Tensor call1(void* o, const std::vector<AotpackArg>& args) {
  AotpackTensor out = nullptr;
  if (host().call_op(o, args.data(), args.size(), &out, 1) != 0) {
    std::fprintf(stderr, "call_op: %s\n", host().last_error());
    return at::Tensor();
  }
  return take_handle(out);
}

void test_host_ops() {
  void* dummy = nullptr;
  EXPECT(host().find_op("aten::no_such_op", "", &dummy) != 0);
  EXPECT(std::string(host().last_error()).find("unknown operator 'aten::no_such_op'") !=
         std::string::npos);
  EXPECT(op("aten::addmm", "") == op("aten::addmm", ""));  // handles are cached

  const at::Tensor a = at::arange(6, at::kFloat).view({2, 3});
  // Scalar argument given as DOUBLE, alpha left to its default.
  const at::Tensor doubled = call1(op("aten::mul", "Scalar"), {targ(a), [] {
                                                                 AotpackArg d{};
                                                                 d.kind = AOTPACK_ARG_DOUBLE;
                                                                 d.v.d = 2.0;
                                                                 return d;
                                                               }()});
  EXPECT(doubled.defined() && at::equal(doubled, a.mul(2)));
  // INT_LIST + BOOL + NONE (sum.dim_IntList(self, int[1]? dim, bool keepdim, *, ScalarType?
  // dtype)).
  const int64_t dim1[] = {1};
  const at::Tensor sums =
      call1(op("aten::sum", "dim_IntList"),
            {targ(a), list_arg(AOTPACK_ARG_INT_LIST, dim1, 1), iarg(AOTPACK_ARG_BOOL, 1),
             iarg(AOTPACK_ARG_SCALAR_TYPE, AOTPACK_DTYPE_FLOAT64)});
  EXPECT(sums.defined() && sums.scalar_type() == at::kDouble &&
         sums.sizes() == c10::IntArrayRef({2, 1}));
  // STRING (div.Tensor_mode rounding_mode).
  AotpackArg mode{};
  mode.kind = AOTPACK_ARG_STRING;
  mode.v.str = "floor";
  const at::Tensor three = at::full_like(a, 3);
  const at::Tensor floored = call1(op("aten::div", "Tensor_mode"), {targ(a), targ(three), mode});
  EXPECT(floored.defined() && floored[1][2].item<float>() == 1.0f);
  // DEVICE, LAYOUT, MEMORY_FORMAT (empty.memory_format).
  AotpackArg device{};
  device.kind = AOTPACK_ARG_DEVICE;
  device.v.str = "cpu";
  const int64_t size[] = {3, 2};
  const at::Tensor empty =
      call1(op("aten::empty", "memory_format"),
            {list_arg(AOTPACK_ARG_INT_LIST, size, 2),
             iarg(AOTPACK_ARG_SCALAR_TYPE, AOTPACK_DTYPE_INT32), iarg(AOTPACK_ARG_LAYOUT, 0),
             device, iarg(AOTPACK_ARG_NONE, 0), iarg(AOTPACK_ARG_MEMORY_FORMAT, 0)});
  EXPECT(empty.defined() && empty.scalar_type() == at::kInt &&
         empty.sizes() == c10::IntArrayRef({3, 2}));
  // Tensor?[] with a NULL entry (index.Tensor: a[:, idx]).
  const at::Tensor idx = at::arange(2, at::kLong);
  const AotpackTensor indices[] = {nullptr, borrow_handle(idx)};
  const at::Tensor picked =
      call1(op("aten::index", "Tensor"), {targ(a), list_arg(AOTPACK_ARG_TENSOR_LIST, indices, 2)});
  EXPECT(picked.defined() && picked.sizes() == c10::IntArrayRef({2, 2}) &&
         picked[1][1].item<float>() == 4.0f);
  // Tensor[] argument (cat) and Tensor[] result (split).
  const AotpackTensor pair[] = {borrow_handle(a), borrow_handle(a)};
  const at::Tensor cat = call1(
      op("aten::cat", ""), {list_arg(AOTPACK_ARG_TENSOR_LIST, pair, 2), iarg(AOTPACK_ARG_INT, 0)});
  EXPECT(cat.defined() && cat.size(0) == 4);
  AotpackTensor parts[3] = {};
  const AotpackArg split_args[] = {targ(cat), iarg(AOTPACK_ARG_INT, 2), iarg(AOTPACK_ARG_INT, 0)};
  EXPECT(host().call_op(op("aten::split", "Tensor"), split_args, 3, parts, 2) == 0);
  EXPECT(parts[0] && parts[1] && at::equal(*reinterpret_cast<at::Tensor*>(parts[1]), a));
  host().release(parts[0]);
  host().release(parts[1]);
  EXPECT(host().call_op(op("aten::split", "Tensor"), split_args, 3, parts, 3) != 0);
  EXPECT(std::string(host().last_error()).find("returned 2 tensor(s), the caller expected 3") !=
         std::string::npos);
  EXPECT(parts[0] == nullptr && parts[2] == nullptr);
}

void test_host_op_errors() {
  AotpackTensor out = nullptr;
  const AotpackArg none_self[] = {iarg(AOTPACK_ARG_NONE, 0)};
  EXPECT(host().call_op(op("aten::relu", ""), none_self, 1, &out, 1) != 0);
  EXPECT(std::string(host().last_error()).find("aten::relu argument 0 ('self'): None") !=
         std::string::npos);
  const at::Tensor a = at::ones({2});
  const AotpackArg too_many[] = {targ(a), targ(a)};
  EXPECT(host().call_op(op("aten::relu", ""), too_many, 2, &out, 1) != 0);
  EXPECT(std::string(host().last_error()).find("takes 1 arguments, got 2") != std::string::npos);
  const at::Tensor b = at::ones({3});
  const AotpackArg mismatch[] = {targ(a), targ(b)};
  EXPECT(host().call_op(op("aten::add", "Tensor"), mismatch, 2, &out, 1) != 0);
  EXPECT(std::string(host().last_error()).find("aten::add.Tensor failed:") != std::string::npos);
  const AotpackArg bad_kind[] = {iarg(99, 0)};
  EXPECT(host().call_op(op("aten::relu", ""), bad_kind, 1, &out, 1) != 0);
  EXPECT(out == nullptr);
}

void test_host_tensors() {
  const int64_t sizes[] = {2, 3}, strides[] = {1, 2};
  AotpackTensor t = nullptr;
  EXPECT(host().empty_strided(2, sizes, strides, AOTPACK_DTYPE_FLOAT32, &t) == 0);
  EXPECT(host().check_layout(t, 2, sizes, strides, AOTPACK_DTYPE_FLOAT32) == 0);
  const int64_t row_major[] = {3, 1};
  EXPECT(host().check_layout(t, 2, sizes, row_major, AOTPACK_DTYPE_FLOAT32) != 0);
  EXPECT(
      std::string(host().last_error()) ==
      "layout mismatch: expected float32[2, 3] strides [3, 1], got float32[2, 3] strides [1, 2]");
  EXPECT(host().check_layout(t, 2, sizes, strides, AOTPACK_DTYPE_FLOAT64) != 0);
  const at::Tensor src = at::arange(6, at::kFloat).view({2, 3});
  EXPECT(host().copy_(t, borrow_handle(src)) == 0);
  EXPECT(at::equal(aotpack::detail::unwrap(t), src));
  // as_strided: row 1 of the transposed storage, offset relative to the base's own offset.
  const int64_t one_size[] = {3}, one_stride[] = {2};
  AotpackTensor row = nullptr;
  EXPECT(host().as_strided(t, 1, one_size, one_stride, 1, &row) == 0);
  EXPECT(at::equal(aotpack::detail::unwrap(row), src[1]));
  AotpackTensor elem = nullptr;
  const int64_t scalar_size[] = {1}, scalar_stride[] = {1};
  EXPECT(host().as_strided(row, 1, scalar_size, scalar_stride, 2, &elem) == 0);  // src[1][1]
  void* p = nullptr;
  EXPECT(host().data_ptr(elem, &p) == 0 && *static_cast<float*>(p) == 4.0f);
  // size-1 dimensions ignore their stride
  const int64_t any_stride[] = {99};
  EXPECT(host().check_layout(elem, 1, scalar_size, any_stride, AOTPACK_DTYPE_FLOAT32) == 0);
  EXPECT(host().empty_strided(1, one_size, one_stride, 1234, &elem) != 0);
  EXPECT(std::string(host().last_error()) == "invalid dtype code 1234");
  EXPECT(host().data_ptr(nullptr, &p) != 0);
  host().release(elem);
  host().release(row);
  host().release(t);
  host().release(nullptr);
}

// ---- the caching host allocator ----

void test_host_pool() {
  using aotpack::detail::HostPool;
  EXPECT(HostPool::block_size(1) == 64 && HostPool::block_size(64) == 64);
  EXPECT(HostPool::block_size(65) == 128);
  EXPECT(HostPool::block_size((1 << 20) + 1) == (1 << 20) + 4096);
  {
    HostPool pool(1 << 20);
    c10::DataPtr a = pool.allocate(1000);
    void* first = a.get();
    EXPECT(reinterpret_cast<uintptr_t>(first) % 64 == 0);
    std::memset(first, 1, 1000);
    a.clear();  // back to the pool, idle
    EXPECT(pool.idle_bytes() == 1024);
    c10::DataPtr b = pool.allocate(1000);
    EXPECT(b.get() == first);  // same size after free: the same block
    EXPECT(pool.idle_bytes() == 0);
    c10::DataPtr c = pool.allocate(990);  // same class, but the block is in use
    EXPECT(c.get() != first && reinterpret_cast<uintptr_t>(c.get()) % 64 == 0);
    b.clear();
    c10::DataPtr d = pool.allocate(600);  // a 1024 B block serves up to twice the request
    EXPECT(d.get() == first);
    d.clear();
    c10::DataPtr e = pool.allocate(200);  // ... but not more
    EXPECT(e.get() != first);
    EXPECT(pool.stats().hits == 2 && pool.stats().misses == 3);
    EXPECT(pool.allocate(0).get() == nullptr);
    // The cap: a released block that would take the idle bytes above it is freed.
    c10::DataPtr big = pool.allocate(2 << 20);
    c.clear();
    e.clear();
    const size_t idle = pool.idle_bytes();
    EXPECT(idle == 1024 + 1024 + 256);
    big.clear();
    EXPECT(pool.idle_bytes() == idle && pool.stats().evicted == 1);
    // Out of memory even after freeing the idle blocks: one line, no crash.
    EXPECT_THROWS(pool.allocate(size_t{1} << 52), "host pool: out of memory allocating");
    EXPECT(pool.idle_bytes() == 0);  // trimmed on the way
    EXPECT_THROWS(pool.allocate(~size_t{0}), "host pool: cannot allocate");
  }
  {
    HostPool off(0);  // AOTPACK_HOST_CACHE_MB=0: nothing kept
    c10::DataPtr a = off.allocate(4096);
    EXPECT(reinterpret_cast<uintptr_t>(a.get()) % 64 == 0);
    a.clear();
    EXPECT(off.idle_bytes() == 0 && off.stats().evicted == 1);
    c10::DataPtr b = off.allocate(4096);
    EXPECT(off.stats().hits == 0 && off.stats().misses == 2);
  }
  // AOTPACK_HOST_CACHE_MB values
  using aotpack::detail::host_cache_cap_from;
  EXPECT(host_cache_cap_from(nullptr) == aotpack::detail::kDefaultHostCacheBytes);
  EXPECT(host_cache_cap_from("") == size_t{1} << 30);
  EXPECT(host_cache_cap_from("0") == 0);
  EXPECT(host_cache_cap_from("64") == size_t{64} << 20);
  for (const char* bad : {"-1", "1.5", "64MB", " 64", "abc", "99999999999999999999"})
    EXPECT_THROWS(host_cache_cap_from(bad),
                  std::string("AOTPACK_HOST_CACHE_MB must be a whole number of MiB (0 turns the "
                              "host buffer cache off), got '") + bad + "'");
  // Tensors from host().empty_strided come from the runtime's pool (default cap here).
  if (std::getenv(AOTPACK_ENV_HOST_CACHE_MB) == nullptr) {
    auto& pool = aotpack::detail::host_pool();
    const int64_t sizes[] = {512, 512}, strides[] = {512, 1};
    AotpackTensor t = nullptr;
    EXPECT(host().empty_strided(2, sizes, strides, AOTPACK_DTYPE_FLOAT32, &t) == 0);
    void* p = nullptr;
    EXPECT(host().data_ptr(t, &p) == 0 && reinterpret_cast<uintptr_t>(p) % 64 == 0);
    host().release(t);
    const uint64_t hits = pool.stats().hits;
    EXPECT(host().empty_strided(2, sizes, strides, AOTPACK_DTYPE_FLOAT32, &t) == 0);
    void* again = nullptr;
    EXPECT(host().data_ptr(t, &again) == 0 && again == p && pool.stats().hits == hits + 1);
    host().release(t);
  }
  // fork(): the child gets the pool unlocked (atfork handlers) and can allocate.
  const pid_t child = fork();
  if (child == 0) {
    c10::DataPtr block = aotpack::detail::host_pool().allocate(100);
    _exit(block.get() != nullptr ? 0 : 1);
  }
  int status = -1;
  EXPECT(child > 0 && waitpid(child, &status, 0) == child && WIFEXITED(status) &&
         WEXITSTATUS(status) == 0);
}

// Threads allocating and freeing blocks of mixed sizes, a small cap so blocks are both
// reused and evicted; every live block keeps its owner's fill, so no two overlap.
void test_host_pool_threads() {
  aotpack::detail::HostPool pool(256 << 10);
  constexpr int kThreads = 8, kRounds = 3000;
  std::vector<int> bad(kThreads, 0);
  std::vector<std::thread> threads;
  for (int id = 0; id < kThreads; ++id) {
    threads.emplace_back([&pool, &bad, id] {
      std::mt19937 rng(id);
      std::vector<std::pair<c10::DataPtr, size_t>> live;
      for (int round = 0; round < kRounds; ++round) {
        if (live.size() < 8 && (live.empty() || rng() % 2)) {
          const size_t n = 1 + rng() % (rng() % 8 == 0 ? (2 << 20) : 4096);
          c10::DataPtr block = pool.allocate(n);
          if (reinterpret_cast<uintptr_t>(block.get()) % 64 != 0) ++bad[id];
          std::memset(block.get(), id + 1, n);
          live.emplace_back(std::move(block), n);
        } else {
          const size_t k = rng() % live.size();
          const auto* bytes = static_cast<const unsigned char*>(live[k].first.get());
          for (size_t i = 0; i < live[k].second; i += 61)
            if (bytes[i] != id + 1) ++bad[id];
          live.erase(live.begin() + k);
        }
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int id = 0; id < kThreads; ++id) EXPECT(bad[id] == 0);
  const auto stats = pool.stats();
  EXPECT(stats.hits > 0 && stats.evicted > 0 && pool.idle_bytes() <= (256 << 10));
}

// ---- temp folder and load errors ----

void test_temp_dir() {
  std::string path;
  {
    auto dir = aotpack::detail::TempDir::create();
    path = dir.path();
    dir.write_file("a/b/c.so", "xyz", 0755);
    EXPECT(std::filesystem::status(path).permissions() == std::filesystem::perms::owner_all);
    EXPECT(std::filesystem::file_size(path + "/a/b/c.so") == 3);
    EXPECT_THROWS(dir.write_file("a/b/c.so", "again", 0644), "cannot create");
  }
  EXPECT(!std::filesystem::exists(path));
}

void test_load_errors() {
  EXPECT_THROWS(aotpack::Model::load("/nonexistent/m.aotpack"),
                "cannot load '/nonexistent/m.aotpack': No such file");
  aotpack_model_t* model = reinterpret_cast<aotpack_model_t*>(0x1);
  EXPECT(aotpack_model_load("/nonexistent/m.aotpack", 0, &model) != 0 && model == nullptr);
  EXPECT(std::string(aotpack_last_error()).find("No such file") != std::string::npos);
  EXPECT(aotpack_model_load(nullptr, 0, &model) != 0);
  EXPECT(aotpack_model_run(nullptr, nullptr, 0, nullptr, 0) != 0);
}

void test_c_tensors() {
  const float values[] = {1, 2, 3, 4, 5, 6};
  const int64_t sizes[] = {2, 3}, strides[] = {1, 2};
  AotpackTensor t = nullptr;
  EXPECT(aotpack_tensor_new(AOTPACK_DTYPE_FLOAT32, 2, sizes, strides, values, &t) == 0);
  int32_t dtype = -1;
  int64_t ndim = -1;
  const int64_t* got_strides = nullptr;
  EXPECT(aotpack_tensor_info(t, &dtype, &ndim, nullptr, &got_strides, nullptr) == 0);
  EXPECT(dtype == AOTPACK_DTYPE_FLOAT32 && ndim == 2 && got_strides[0] == 1 && got_strides[1] == 2);
  EXPECT(aotpack::detail::unwrap(t)[1][0].item<float>() == 4.0f);
  aotpack_tensor_free(t);
  EXPECT(aotpack_tensor_new(99, 2, sizes, nullptr, nullptr, &t) != 0 && t == nullptr);
}

}  // namespace

int main() {
  test_entry_paths();
  test_npy_round_trip();
  test_npy_errors();
  test_safetensors();
  test_manifest();
  test_compat();
  test_device_registry();
  test_abi_versions();
  test_host_ops();
  test_host_op_errors();
  test_host_tensors();
  test_host_pool();
  test_host_pool_threads();
  test_temp_dir();
  test_elf_check();
  test_cores();
  test_load_errors();
  test_c_tensors();
  std::printf("%d/%d checks passed\n", g_checks - g_failures, g_checks);
  return g_failures == 0 ? 0 : 1;
}
