// aotpack-run: load a .aotpack archive, run it on .npy inputs, write or print the outputs,
// optionally time it. Exit status 0 on success, 1 on any error, 2 on a usage error.
#include <ATen/Parallel.h>
#include <ATen/ops/empty.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <atomic>
#include <csignal>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>
#include <sched.h>
#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "aotpack/runtime.h"
#include "npy.h"  // the outputs' .npz

namespace {

constexpr char kUsage[] =
    "usage: aotpack-run ARCHIVE INPUT.npy... [--output OUT.npz] [--bench N] [--warmup W]\n"
    "                   [--device-limit C] [--cores LIST] [--trusted-key PUB.pem]...\n"
    "                   [--require-signature] [-v]\n"
    "       aotpack-run ARCHIVE --check [--trusted-key PUB.pem]... [--require-signature] [-v]\n"
    "\n"
    "Load a .aotpack archive, run it once on the given .npy inputs (manifest order) and\n"
    "print each output's name, dtype, shape and first values.\n"
    "\n"
    "  --output OUT.npz   write the outputs to OUT.npz instead (members named after the\n"
    "                     manifest's output names, else output_0, output_1, ...; written\n"
    "                     atomically)\n"
    "  --bench N          after W warm-up runs, time N runs and print\n"
    "                       load_ms=<ms>\n"
    "                       latency_us median=<us> p10=<us> p90=<us> runs=<N>\n"
    "  --warmup W         warm-up runs before timing (default 10)\n"
    "  --check            only load the archive (checksums of every byte, even when its\n"
    "                     cache entry exists; torch version, CPU features, model.so) and\n"
    "                     print 'ok: NAME VERSION'\n"
    "  --device-limit C   cores the model may use: fused kernels and ATen threads\n"
    "                     (default 0: the build-time limit for kernels, all for ATen);\n"
    "                     more than the cores available to this process is an error\n"
    "  --cores LIST       run the model on this core partition (\"0-3\", \"0,2\"): its\n"
    "                     threads are pinned there and the device limit is their number\n"
    "  --trusted-key PUB  require a valid Ed25519 signature by this public key (PEM);\n"
    "                     repeatable, adds to AOTPACK_TRUSTED_KEYS (colon-separated;\n"
    "                     set but naming no key is an error)\n"
    "  --require-signature  refuse to load unless trusted keys are set, so only a validly\n"
    "                     signed archive loads (also AOTPACK_REQUIRE_SIGNATURE=1)\n"
    "  -v, --verbose      after the load, print whether the archive was signed and by which\n"
    "                     key: 'signature: ...'\n"
    "\n"
    "The archive is extracted to $XDG_CACHE_HOME/aotpack/runtime/ (default ~/.cache) and\n"
    "reused by later runs; AOTPACK_RUNTIME_CACHE=0 extracts to a private $TMPDIR folder.\n"
    "SIGINT, SIGTERM and SIGHUP stop it cleanly (exit 128+signal) with nothing left behind.\n"
    "AOTPACK_PROFILE=1 prints each fused kernel's launches and time (us) to stderr at exit.\n"
    "  -h, --help         show this help\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string archive;
  std::vector<std::string> inputs;
  std::string output;
  int64_t bench_runs = 0;
  int64_t warmup_runs = 10;
  int32_t device_limit = 0;
  std::vector<int32_t> cores;
  std::vector<std::string> trusted_keys;
  bool help = false;
  bool check = false;
  bool require_signature = false;
  bool verbose = false;
};

int64_t parse_count(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  char* end = nullptr;
  errno = 0;
  long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max)
    throw UsageError(flag + " expects an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  return value;
}

// A cpulist ("0-3,6") as CPU ids; the runtime checks them against the affinity mask.
std::vector<int32_t> parse_cores(const std::string& text) {
  std::vector<int32_t> cores;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string part = text.substr(at, comma - at);
    const size_t dash = part.find('-');
    const int64_t first = parse_count("--cores", part.substr(0, dash), 0, CPU_SETSIZE - 1);
    const int64_t last = dash == std::string::npos ? first : parse_count("--cores", part.substr(dash + 1), first, CPU_SETSIZE - 1);
    for (int64_t c = first; c <= last; ++c) cores.push_back(static_cast<int32_t>(c));
    at = comma + 1;
  }
  return cores;
}

// "--flag value" or "--flag=value"; returns false when `arg` is not `flag`.
bool take_value(const std::string& flag, int argc, char** argv, int* i, std::string* value) {
  const std::string arg = argv[*i];
  if (arg.rfind(flag + "=", 0) == 0) {
    *value = arg.substr(flag.size() + 1);
    return true;
  }
  if (arg != flag) return false;
  if (*i + 1 >= argc) throw UsageError(flag + " needs a value");
  *value = argv[++*i];
  return true;
}

Options parse_args(int argc, char** argv) {
  Options opt;
  std::vector<std::string> positional;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    std::string value;
    if (arg == "-h" || arg == "--help") {
      opt.help = true;
    } else if (arg == "--check") {
      opt.check = true;
    } else if (arg == "--require-signature") {
      opt.require_signature = true;
    } else if (arg == "-v" || arg == "--verbose") {
      opt.verbose = true;
    } else if (take_value("--output", argc, argv, &i, &value)) {
      if (value.empty()) throw UsageError("--output needs a file name");
      opt.output = value;
    } else if (take_value("--bench", argc, argv, &i, &value)) {
      opt.bench_runs = parse_count("--bench", value, 1, 100000000);
    } else if (take_value("--warmup", argc, argv, &i, &value)) {
      opt.warmup_runs = parse_count("--warmup", value, 0, 100000000);
    } else if (take_value("--device-limit", argc, argv, &i, &value)) {
      opt.device_limit = static_cast<int32_t>(parse_count("--device-limit", value, 0, 1 << 20));
    } else if (take_value("--cores", argc, argv, &i, &value)) {
      opt.cores = parse_cores(value);
    } else if (take_value("--trusted-key", argc, argv, &i, &value)) {
      if (value.empty()) throw UsageError("--trusted-key needs a file name");
      opt.trusted_keys.push_back(value);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      positional.push_back(arg);
    }
  }
  if (opt.help) return opt;
  if (positional.empty()) throw UsageError("missing ARCHIVE");
  opt.archive = positional.front();
  opt.inputs.assign(positional.begin() + 1, positional.end());
  if (opt.check && (!opt.inputs.empty() || !opt.output.empty() || opt.bench_runs > 0))
    throw UsageError("--check only loads the archive: give no inputs, --output or --bench with it");
  return opt;
}

// ---- signals: the first SIGINT/SIGTERM/SIGHUP asks for a clean stop (checked after the
// load and between runs, so the model's folder is released by its destructor); a second
// one acts as usual ----

std::atomic<int> g_stop_signal{0};

extern "C" void on_stop_signal(int sig) {
  g_stop_signal.store(sig);
  std::signal(sig, SIG_DFL);
}

void install_stop_handlers() {
  for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
    struct sigaction action{};
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaction(sig, &action, nullptr);
  }
}

struct Stopped {
  int signal;
};

void stop_if_signalled() {
  if (const int sig = g_stop_signal.load()) throw Stopped{sig};
}

// ---- inputs ----

std::string signature(const std::vector<aotpack::TensorSpec>& specs) {
  std::string out;
  for (const auto& s : specs)
    out += (out.empty() ? "" : ", ") + s.name + ": " + aotpack::describe(s.dtype, s.shape);
  return out;
}

at::Tensor load_input(const std::string& path, size_t index, const aotpack::TensorSpec& spec) {
  at::Tensor t = aotpack::load_npy(path);  // the runtime's reader, as `aotpack run`'s
  const c10::ScalarType stored = t.scalar_type();
  // .npy has no bfloat16: accept float32 data for a bfloat16 input and convert it.
  if (spec.dtype == c10::ScalarType::BFloat16 && stored == c10::ScalarType::Float)
    t = t.to(c10::ScalarType::BFloat16);
  if (t.scalar_type() != spec.dtype || !t.sizes().equals(spec.shape))
    throw aotpack::Error("input " + std::to_string(index) + " ('" + spec.name + "'): expected " +
                         aotpack::describe(spec.dtype, spec.shape) + ", got " +
                         aotpack::describe(stored, t.sizes().vec()) + " from " + path);
  return t;
}

std::vector<at::Tensor> load_inputs(const Options& opt, const aotpack::Model& model) {
  const auto& specs = model.inputs();
  if (opt.inputs.size() != specs.size())
    throw aotpack::Error("model '" + model.name() + "' takes " + std::to_string(specs.size()) +
                         " input(s) (" + signature(specs) + "), got " +
                         std::to_string(opt.inputs.size()) + " .npy file(s)");
  std::vector<at::Tensor> inputs;
  for (size_t i = 0; i < specs.size(); ++i)
    inputs.push_back(load_input(opt.inputs[i], i, specs[i]));
  return inputs;
}

// ---- outputs ----

bool is_safe_member_name(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.size() > 200) return false;
  return std::all_of(name.begin(), name.end(), [](unsigned char c) {
    return std::isalnum(c) || c == '_' || c == '-' || c == '.';
  });
}

// Manifest output names where they are usable as zip member names, else output_<i>.
std::vector<std::string> output_names(const aotpack::Model& model) {
  std::vector<std::string> names;
  std::set<std::string> used;
  for (size_t i = 0; i < model.outputs().size(); ++i) {
    std::string name = model.outputs()[i].name;
    if (!is_safe_member_name(name) || used.count(name)) name = "output_" + std::to_string(i);
    used.insert(name);
    names.push_back(name);
  }
  return names;
}

// Row-major tensor with a dtype .npy can hold (bfloat16 -> float32).
at::Tensor npy_ready(const at::Tensor& t) {
  at::Tensor out = t.scalar_type() == c10::ScalarType::BFloat16 ? t.to(c10::ScalarType::Float) : t;
  return out.contiguous();
}

void write_outputs(const std::string& path, const aotpack::Model& model,
                   const std::vector<at::Tensor>& outputs) {
  const std::vector<std::string> names = output_names(model);
  std::vector<std::pair<std::string, std::string>> members;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor t = npy_ready(outputs[i]);
    members.emplace_back(names[i],
                         aotpack::npy::encode(t.scalar_type(), t.sizes().vec(), t.data_ptr(),
                                              t.numel() * t.element_size()));
  }
  aotpack::npy::write_npz(path, members);
}

double element_as_double(const at::Tensor& t, int64_t i) {
  const void* p = t.data_ptr();
  switch (t.scalar_type()) {
    case c10::ScalarType::Float: return static_cast<const float*>(p)[i];
    case c10::ScalarType::Double: return static_cast<const double*>(p)[i];
    case c10::ScalarType::Half: return static_cast<float>(static_cast<const c10::Half*>(p)[i]);
    case c10::ScalarType::BFloat16:
      return static_cast<float>(static_cast<const c10::BFloat16*>(p)[i]);
    case c10::ScalarType::Long: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case c10::ScalarType::Int: return static_cast<const int32_t*>(p)[i];
    case c10::ScalarType::Short: return static_cast<const int16_t*>(p)[i];
    case c10::ScalarType::Char: return static_cast<const int8_t*>(p)[i];
    case c10::ScalarType::Byte: return static_cast<const uint8_t*>(p)[i];
    case c10::ScalarType::Bool: return static_cast<const bool*>(p)[i] ? 1 : 0;
    default: return NAN;
  }
}

void print_outputs(const aotpack::Model& model, const std::vector<at::Tensor>& outputs) {
  const std::vector<std::string> names = output_names(model);
  constexpr int64_t kShown = 8;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const at::Tensor t = outputs[i].contiguous();
    std::printf("%s: %s =", names[i].c_str(),
                aotpack::describe(t.scalar_type(), t.sizes().vec()).c_str());
    for (int64_t k = 0; k < std::min(kShown, t.numel()); ++k)
      std::printf(" %.6g", element_as_double(t, k));
    if (t.numel() > kShown) std::printf(" ... (%lld values)", static_cast<long long>(t.numel()));
    std::printf("\n");
  }
}

// ---- bench ----

double percentile(const std::vector<double>& sorted, double p) {
  const double index = p * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(index)),
               hi = static_cast<size_t>(std::ceil(index));
  return sorted[lo] + (sorted[hi] - sorted[lo]) * (index - static_cast<double>(lo));
}

double elapsed_us(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start)
      .count();
}

std::vector<at::Tensor> bench(aotpack::Model& model, const std::vector<at::Tensor>& inputs,
                              const Options& opt) {
  std::vector<at::Tensor> outputs;
  for (int64_t i = 0; i < opt.warmup_runs; ++i) {
    stop_if_signalled();
    outputs = model.run(inputs);
  }
  std::vector<double> latencies;
  latencies.reserve(opt.bench_runs);
  for (int64_t i = 0; i < opt.bench_runs; ++i) {
    stop_if_signalled();
    const auto start = std::chrono::steady_clock::now();
    outputs = model.run(inputs);
    latencies.push_back(elapsed_us(start));
  }
  std::sort(latencies.begin(), latencies.end());
  std::printf("latency_us median=%.2f p10=%.2f p90=%.2f runs=%lld\n", percentile(latencies, 0.5),
              percentile(latencies, 0.1), percentile(latencies, 0.9),
              static_cast<long long>(opt.bench_runs));
  return outputs;
}

// -v: "signature: valid, key PATH (sha256 HEX)", "... present, not checked ..." or "none".
std::string signature_line(const aotpack::SignatureInfo& info) {
  switch (info.state) {
    case AOTPACK_SIGNATURE_VERIFIED:
      return "signature: valid, key " + info.key_path + " (sha256 " + info.key_sha256 + ")";
    case AOTPACK_SIGNATURE_UNCHECKED:
      return "signature: present, not checked (no trusted keys given)";
    default:
      return "signature: none (unsigned archive)";
  }
}

int run_tool(const Options& opt) {
  aotpack::LoadOptions load_options;
  load_options.device_limit = opt.device_limit;  // Model::load checks it
  load_options.trusted_keys = opt.trusted_keys;
  load_options.require_signature = opt.require_signature;
  load_options.verify_archive = opt.check;  // --check reads every byte, cached or not
  load_options.cores = opt.cores;
  const auto start = std::chrono::steady_clock::now();
  aotpack::Model model = aotpack::Model::load(opt.archive, load_options);
  const double load_ms = elapsed_us(start) / 1000.0;
  if (opt.verbose) std::printf("%s\n", signature_line(model.signature()).c_str());
  // The limit covers the whole model: fused kernels (via the model) and ATen's
  // extern calls (its intra-op thread pool) alike. A partition sets both on its own thread.
  if (opt.device_limit > 0 && opt.cores.empty()) at::set_num_threads(opt.device_limit);
  for (const std::string& w : model.warnings()) std::fprintf(stderr, "aotpack-run: warning: %s\n", w.c_str());
  stop_if_signalled();
  if (opt.check) {
    std::printf("ok: %s %s (loaded in %.1f ms)\n", model.name().c_str(), model.version().c_str(), load_ms);
    return 0;
  }
  const std::vector<at::Tensor> inputs = load_inputs(opt, model);
  stop_if_signalled();
  std::vector<at::Tensor> outputs;
  if (opt.bench_runs > 0) {
    std::printf("load_ms=%.3f\n", load_ms);
    std::fflush(stdout);  // a caller waiting for the load sees it now
    outputs = bench(model, inputs, opt);
  } else {
    outputs = model.run(inputs);
  }
  if (!opt.output.empty())
    write_outputs(opt.output, model, outputs);
  else
    print_outputs(model, outputs);
  return 0;
}

// An ATen call inside a model (an extern op; oneDNN's reorders within it) allocates and
// frees its scratch on every run. glibc hands a freed chunk over 128 KiB (mmap) or a free
// heap top over 128 KiB (trim) back to the kernel at once, so every run page-faults it in
// again: MobileNetV3 with its stem convolution on ATen ran at 2.46 ms instead of 1.56 ms per
// call at 1 thread. This process is ours: keep up to 256 MiB of freed memory for reuse.
// (A program embedding the runtime can do the same with mallopt or GLIBC_TUNABLES.)
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

}  // namespace

int main(int argc, char** argv) {
  install_stop_handlers();
  keep_freed_memory();
  try {
    const Options opt = parse_args(argc, argv);
    if (opt.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return run_tool(opt);
  } catch (const Stopped& stopped) {
    std::fprintf(stderr, "aotpack-run: stopped by signal %d\n", stopped.signal);
    return 128 + stopped.signal;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "aotpack-run: error: %s\n(run 'aotpack-run --help' for usage)\n",
                 e.what());
    return 2;
  } catch (const c10::Error& e) {  // from libtorch directly: drop the C++ backtrace
    std::fprintf(stderr, "aotpack-run: error: %s\n", e.what_without_backtrace());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aotpack-run: error: %s\n", e.what());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "aotpack-run: error: unknown exception\n");
    return 1;
  }
}
