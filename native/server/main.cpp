// aotpack-serve: serves a model repository over HTTP with the KServe v2 Open Inference
// Protocol (docs/deploy.md). Exit status 0 after SIGTERM/SIGINT (in-flight requests drained),
// 1 when it cannot start, 2 for a usage error.
#include <httplib.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "protocol.h"
#include "repository.h"

namespace {

using aotpack::serve::HttpError;
using aotpack::serve::ModelVersion;
using aotpack::serve::Repository;
using nlohmann::json;

constexpr char kVersion[] = "0.1.0";

constexpr char kUsage[] =
    "usage: aotpack-serve MODEL_DIR [--port 8000] [--host 0.0.0.0] [--instances N]\n"
    "                     [--cores-per-instance K] [--http-threads T] [--max-connections C]\n"
    "                     [--max-queue Q] [--max-body-mb M] [--timeout-s S] [--drain-timeout-s D]\n"
    "\n"
    "Serve every MODEL_DIR/<name>/<version>/*.aotpack (one archive per version folder,\n"
    "version folders numbered: Triton's layout) over HTTP with the KServe v2 Open Inference\n"
    "Protocol: /v2/health/{live,ready}, /v2, /v2/models/<name>[/versions/<v>][/ready|/infer]\n"
    "(JSON tensors and the binary tensor data extension) and /metrics (Prometheus).\n"
    "\n"
    "  --port P               TCP port (default 8000; 0 = any free port, printed at start)\n"
    "  --host H               address to listen on (default 0.0.0.0)\n"
    "  --instances N          instances of each model version, fed from one queue (default 1)\n"
    "  --cores-per-instance K cores of each instance's partition: instance i runs on the\n"
    "                         process's allowed cores [i*K, (i+1)*K) (default: the allowed\n"
    "                         cores divided by N; 0 = instances not pinned)\n"
    "  --http-threads T       threads serving connections (default 16)\n"
    "  --max-connections C    connections waiting for a thread beyond those T; more are\n"
    "                         answered 503 (default 256)\n"
    "  --max-queue Q          requests waiting for an instance, per model version; more are\n"
    "                         answered 503 (default 64)\n"
    "  --max-body-mb M        largest request body, MiB (default 64; larger: 413)\n"
    "  --timeout-s S          read/write timeout of a connection, and idle keep-alive\n"
    "                         timeout, seconds (default 5)\n"
    "  --drain-timeout-s D    on SIGTERM, how long in-flight requests may take (default 30)\n"
    "  -h, --help             show this help\n";

struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  std::string model_dir;
  std::string host = "0.0.0.0";
  int64_t port = 8000;
  int64_t instances = 1;
  int64_t cores_per_instance = -1;  // -1: allowed cores / instances
  int64_t http_threads = 16;
  int64_t max_connections = 256;
  int64_t max_queue = 64;
  int64_t max_body_mb = 64;
  int64_t timeout_s = 5;
  int64_t drain_timeout_s = 30;
  bool help = false;
};

int64_t parse_count(const std::string& flag, const std::string& text, int64_t min, int64_t max) {
  char* end = nullptr;
  errno = 0;
  const long long value = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || errno != 0 || value < min || value > max)
    throw UsageError(flag + " expects an integer in [" + std::to_string(min) + ", " +
                     std::to_string(max) + "], got '" + text + "'");
  return value;
}

Options parse_args(int argc, char** argv) {
  Options opt;
  std::vector<std::string> positional;
  struct Flag {
    const char* name;
    int64_t* target;
    int64_t min, max;
  };
  const Flag flags[] = {{"--port", &opt.port, 0, 65535},
                        {"--instances", &opt.instances, 1, 1024},
                        {"--cores-per-instance", &opt.cores_per_instance, 0, 1 << 16},
                        {"--http-threads", &opt.http_threads, 1, 4096},
                        {"--max-connections", &opt.max_connections, 1, 1 << 20},
                        {"--max-queue", &opt.max_queue, 1, 1 << 20},
                        {"--max-body-mb", &opt.max_body_mb, 1, 1 << 20},
                        {"--timeout-s", &opt.timeout_s, 1, 3600},
                        {"--drain-timeout-s", &opt.drain_timeout_s, 0, 3600}};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "-h" || arg == "--help") {
      opt.help = true;
      continue;
    }
    bool matched = false;
    for (const Flag& f : flags) {
      const std::string name = f.name;
      std::string value;
      if (arg.rfind(name + "=", 0) == 0) {
        value = arg.substr(name.size() + 1);
      } else if (arg == name) {
        if (i + 1 >= argc) throw UsageError(name + " needs a value");
        value = argv[++i];
      } else {
        continue;
      }
      *f.target = parse_count(name, value, f.min, f.max);
      matched = true;
    }
    if (matched) continue;
    if (arg == "--host" || arg.rfind("--host=", 0) == 0) {
      if (arg == "--host" && i + 1 >= argc) throw UsageError("--host needs a value");
      opt.host = arg == "--host" ? argv[++i] : arg.substr(7);
    } else if (arg.size() > 1 && arg[0] == '-') {
      throw UsageError("unknown option '" + arg + "'");
    } else {
      positional.push_back(arg);
    }
  }
  if (opt.help) return opt;
  if (positional.size() != 1)
    throw UsageError(positional.empty() ? "missing MODEL_DIR" : "give one MODEL_DIR, got " + std::to_string(positional.size()));
  opt.model_dir = positional.front();
  return opt;
}

// ---- core partitions ----

std::vector<int32_t> allowed_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  std::vector<int32_t> cores;
  if (sched_getaffinity(0, sizeof(set), &set) == 0)
    for (int32_t c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cores.push_back(c);
  return cores;
}

// Instance i's cores: the allowed cores [i*K, (i+1)*K); K = 0 gives unpinned instances.
std::vector<std::vector<int32_t>> partitions(const Options& opt) {
  const std::vector<int32_t> allowed = allowed_cores();
  const auto n = static_cast<size_t>(opt.instances);
  size_t k = opt.cores_per_instance >= 0 ? static_cast<size_t>(opt.cores_per_instance)
                                         : std::max<size_t>(1, allowed.size() / n);
  std::vector<std::vector<int32_t>> out(n);
  if (k == 0) return out;
  if (n * k > allowed.size())
    throw UsageError("--instances " + std::to_string(n) + " x --cores-per-instance " + std::to_string(k) +
                     " needs " + std::to_string(n * k) + " cores; this process may use " +
                     std::to_string(allowed.size()));
  for (size_t i = 0; i < n; ++i) out[i].assign(allowed.begin() + i * k, allowed.begin() + (i + 1) * k);
  return out;
}

// ---- connections: bounded ----

// Set on the thread that answers connections beyond the bound: its requests get 503.
thread_local bool t_overflow = false;

// httplib's thread pool with bounded waiting: `threads` threads serve connections and at most
// `max_waiting` more wait for one; beyond that, one extra thread answers each connection's
// requests with 503 at once (it too keeps at most `max_waiting` waiting; past both bounds the
// accept loop blocks, and the kernel's listen backlog holds further clients). A flood of
// connections costs threads and memory in proportion to these bounds only.
class BoundedPool final : public httplib::TaskQueue {
 public:
  BoundedPool(size_t threads, size_t max_waiting) : capacity_(threads + max_waiting), max_waiting_(max_waiting) {
    for (size_t i = 0; i < threads; ++i) threads_.emplace_back([this] { work(jobs_, false); });
    threads_.emplace_back([this] { work(overflow_, true); });
  }

  void enqueue(std::function<void()> fn) override {
    std::unique_lock<std::mutex> lock(mutex_);
    // Counted as in service from the moment it is queued, so the lane does not depend on how
    // soon a thread picks a connection up.
    space_.wait(lock, [&] { return admitted_ < capacity_ || overflow_.size() < max_waiting_ || shutdown_; });
    if (admitted_ < capacity_) {
      ++admitted_;
      jobs_.push_back(std::move(fn));
    } else {
      overflow_.push_back(std::move(fn));
    }
    lock.unlock();
    ready_.notify_all();
  }

  void shutdown() override {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      shutdown_ = true;
    }
    ready_.notify_all();
    space_.notify_all();
    for (std::thread& t : threads_) t.join();
  }

 private:
  void work(std::deque<std::function<void()>>& queue, bool overflow) {
    t_overflow = overflow;
    for (;;) {
      std::function<void()> fn;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        ready_.wait(lock, [&] { return !queue.empty() || shutdown_; });
        if (queue.empty()) return;
        fn = std::move(queue.front());
        queue.pop_front();
      }
      if (overflow) space_.notify_one();  // its queue has room again
      fn();                               // serves the connection until it closes
      if (!overflow) {
        {
          std::lock_guard<std::mutex> lock(mutex_);
          --admitted_;
        }
        space_.notify_one();
      }
    }
  }

  const size_t capacity_;  // threads + max_waiting: connections the serving lane admits
  const size_t max_waiting_;
  std::mutex mutex_;
  size_t admitted_ = 0;  // connections queued or being served in the serving lane
  std::condition_variable ready_, space_;
  std::deque<std::function<void()>> jobs_, overflow_;
  bool shutdown_ = false;
  std::vector<std::thread> threads_;
};

// ---- the server ----

class Server {
 public:
  Server(const Options& opt, Repository& repo) : opt_(opt), repo_(repo) {}

  void set_up() {
    http_.new_task_queue = [this] {
      return new BoundedPool(static_cast<size_t>(opt_.http_threads), static_cast<size_t>(opt_.max_connections));
    };
    http_.set_payload_max_length(static_cast<size_t>(opt_.max_body_mb) << 20);
    http_.set_read_timeout(opt_.timeout_s, 0);
    http_.set_write_timeout(opt_.timeout_s, 0);
    http_.set_keep_alive_timeout(opt_.timeout_s);
    http_.set_keep_alive_max_count(1000);
    http_.set_tcp_nodelay(true);
    http_.set_pre_routing_handler([this](const httplib::Request&, httplib::Response& res) {
      if (!t_overflow) return httplib::Server::HandlerResponse::Unhandled;
      res.set_header("Connection", "close");
      error(res, 503, "the server is busy: " + std::to_string(opt_.http_threads) + " connections are being served and " +
                          std::to_string(opt_.max_connections) + " wait (--http-threads, --max-connections); retry later");
      return httplib::Server::HandlerResponse::Handled;
    });
    // Errors httplib raises itself (no route, a body over the limit, a bad request line).
    http_.set_error_handler([this](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;
      std::string message;
      if (res.status == 404) message = "no such endpoint: " + req.method + " " + req.path;
      else if (res.status == 413) message = "the request body is larger than " + std::to_string(opt_.max_body_mb) + " MiB (--max-body-mb)";
      else if (res.status == 400) message = "malformed HTTP request";
      else message = "HTTP error " + std::to_string(res.status);
      res.set_content(aotpack::serve::error_body(message), "application/json");
    });
    http_.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string message = "internal error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        message += std::string(": ") + e.what();
      } catch (...) {
      }
      res.status = 500;
      res.set_content(aotpack::serve::error_body(message), "application/json");
    });

    http_.Get("/v2/health/live", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("{\"live\":true}", "application/json");
    });
    http_.Get("/v2/health/ready", [this](const httplib::Request&, httplib::Response& res) {
      const bool ready = !draining_ && repo_.all_ready();
      res.status = ready ? 200 : 503;
      res.set_content(json{{"ready", ready}}.dump(), "application/json");
    });
    http_.Get("/v2", [](const httplib::Request&, httplib::Response& res) {
      json meta = {{"name", "aotpack-serve"}, {"version", kVersion}, {"extensions", {"binary_tensor_data"}}};
      res.set_content(meta.dump(), "application/json");
    });
    const std::string model = R"(/v2/models/([^/]+)(?:/versions/([^/]+))?)";
    http_.Get(model, [this](const httplib::Request& req, httplib::Response& res) {
      handle(res, [&] { metadata(req, res); });
    });
    http_.Get(model + "/ready", [this](const httplib::Request& req, httplib::Response& res) {
      handle(res, [&] {
        ModelVersion& v = repo_.find(req.matches[1], req.matches[2]);
        res.status = v.ready() && !draining_ ? 200 : 400;
        res.set_content(json{{"name", v.name()}, {"ready", res.status == 200}}.dump(), "application/json");
      });
    });
    http_.Post(model + "/infer", [this](const httplib::Request& req, httplib::Response& res) { infer(req, res); });
    http_.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      std::string text =
          "# HELP aotpack_model_ready 1 when the model version loaded.\n# TYPE aotpack_model_ready gauge\n"
          "# HELP aotpack_model_instances Instances of the model version.\n# TYPE aotpack_model_instances gauge\n"
          "# HELP aotpack_inference_requests_total Inference requests (successful and failed).\n"
          "# TYPE aotpack_inference_requests_total counter\n"
          "# HELP aotpack_inference_failures_total Inference requests answered with an error.\n"
          "# TYPE aotpack_inference_failures_total counter\n"
          "# HELP aotpack_inference_queue_seconds Time a request waited for a free instance.\n"
          "# TYPE aotpack_inference_queue_seconds histogram\n"
          "# HELP aotpack_inference_compute_seconds Time of the model run.\n"
          "# TYPE aotpack_inference_compute_seconds histogram\n";
      for (const auto& v : repo_.all()) text += v->metrics_text();
      res.set_content(text, "text/plain; version=0.0.4");
    });
  }

  /// Binds; returns the port (useful with --port 0). Throws when the address is taken.
  int bind() {
    if (opt_.port == 0) {
      const int port = http_.bind_to_any_port(opt_.host);
      if (port < 0) throw std::runtime_error("cannot listen on " + opt_.host);
      return port;
    }
    if (!http_.bind_to_port(opt_.host, static_cast<int>(opt_.port)))
      throw std::runtime_error("cannot listen on " + opt_.host + ":" + std::to_string(opt_.port) +
                               " (in use, or not an address of this machine)");
    return static_cast<int>(opt_.port);
  }

  void listen() {
    http_.listen_after_bind();
    listen_returned_ = true;
  }

  /// SIGTERM: new inference requests get 503, readiness turns false; waits up to the drain
  /// timeout for the in-flight ones, then stops listening. Returns how many were in flight.
  int drain_and_stop() {
    draining_ = true;
    const int in_flight = in_flight_.load();
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(opt_.drain_timeout_s);
    std::unique_lock<std::mutex> lock(drain_mutex_);
    drained_.wait_until(lock, deadline, [this] { return in_flight_.load() == 0; });
    lock.unlock();
    // httplib's stop() does nothing before listen() has started: a signal that came during
    // the models' load is taken as soon as the server runs.
    while (!http_.is_running() && !listen_returned_) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    http_.stop();
    return in_flight;
  }

  int still_in_flight() const { return in_flight_.load(); }

 private:
  static void error(httplib::Response& res, int status, const std::string& message) {
    res.status = status;
    res.set_content(aotpack::serve::error_body(message), "application/json");
  }

  template <class Body>
  static void handle(httplib::Response& res, Body&& body) {
    try {
      body();
    } catch (const HttpError& e) {
      error(res, e.status, e.what());
    }
  }

  void metadata(const httplib::Request& req, httplib::Response& res) {
    ModelVersion& v = repo_.find(req.matches[1], req.matches[2]);
    if (!v.ready())
      throw HttpError(503, "model '" + v.name() + "' version " + v.version() + " is not ready: " + v.error());
    json versions = json::array();
    if (req.matches[2].length()) {
      versions.push_back(v.version());
    } else {
      for (ModelVersion* other : repo_.versions(v.name()))
        if (other->ready()) versions.push_back(other->version());
    }
    json meta = {{"name", v.name()},
                 {"versions", versions},
                 {"platform", "aotpack"},
                 {"inputs", aotpack::serve::tensor_metadata(v.signature().inputs)},
                 {"outputs", aotpack::serve::tensor_metadata(v.signature().outputs)}};
    res.set_content(meta.dump(), "application/json");
  }

  void infer(const httplib::Request& req, httplib::Response& res) {
    struct InFlight {  // counted until the response is built, so a drain waits for it
      Server* s;
      explicit InFlight(Server* s) : s(s) { s->in_flight_.fetch_add(1); }
      ~InFlight() {
        if (s->in_flight_.fetch_sub(1) == 1) {
          std::lock_guard<std::mutex> lock(s->drain_mutex_);
          s->drained_.notify_all();
        }
      }
    } in_flight(this);
    ModelVersion* version = nullptr;
    try {
      version = &repo_.find(req.matches[1], req.matches[2]);
      if (draining_) throw HttpError(503, "the server is shutting down");
      if (!version->ready())
        throw HttpError(503, "model '" + version->name() + "' version " + version->version() +
                                 " is not ready: " + version->error());
      const aotpack::serve::InferRequest request = aotpack::serve::parse_infer_request(
          req.body, req.get_header_value(aotpack::serve::kHeaderLengthField), version->signature());
      const std::vector<at::Tensor> outputs = version->infer(request.inputs);
      aotpack::serve::InferResponse response =
          aotpack::serve::encode_infer_response(request, version->signature(), outputs);
      if (response.header_length >= 0)
        res.set_header(aotpack::serve::kHeaderLengthField, std::to_string(response.header_length));
      res.set_content(std::move(response.body), response.content_type.c_str());
      version->count_request(false);
    } catch (const HttpError& e) {
      if (version) version->count_request(true);
      error(res, e.status, e.what());
    }
  }

  const Options& opt_;
  Repository& repo_;
  httplib::Server http_;
  std::atomic<bool> draining_{false};
  std::atomic<bool> listen_returned_{false};
  std::atomic<int> in_flight_{0};
  std::mutex drain_mutex_;
  std::condition_variable drained_;
};

// As aotpack-run: keep freed memory for reuse (ATen ops' scratch would otherwise be
// returned to the kernel and faulted in again on every run).
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 256 << 20);
#endif
}

// SIGTERM and SIGINT, taken by one thread with sigwait.
sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

int serve(const Options& opt) {
  const sigset_t stop_signals = stop_signal_set();
  signal(SIGPIPE, SIG_IGN);  // a client that hangs up must not kill the server

  const std::vector<std::vector<int32_t>> cores = partitions(opt);
  Repository repo(opt.model_dir, cores, static_cast<size_t>(opt.max_queue));
  for (const auto& v : repo.all()) {
    if (!v->ready()) {
      std::fprintf(stderr, "aotpack-serve: model '%s' version %s is not ready: %s\n", v->name().c_str(),
                   v->version().c_str(), v->error().c_str());
      continue;
    }
    std::string where;
    for (const std::string& p : v->partitions()) where += (where.empty() ? "" : " ") + (p.empty() ? "unpinned" : p);
    std::fprintf(stderr, "aotpack-serve: model '%s' version %s ready: %zu instance(s) on cores %s\n",
                 v->name().c_str(), v->version().c_str(), v->partitions().size(), where.c_str());
    for (const std::string& w : v->warnings()) std::fprintf(stderr, "aotpack-serve: warning: %s\n", w.c_str());
  }
  Server server(opt, repo);
  server.set_up();
  const int port = server.bind();
  std::fprintf(stderr, "aotpack-serve: listening on %s:%d\n", opt.host.c_str(), port);
  std::printf("port=%d\n", port);
  std::fflush(stdout);

  std::thread waiter([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "aotpack-serve: signal %d: draining %d in-flight request(s)\n", sig,
                 server.still_in_flight());
    server.drain_and_stop();
  });
  server.listen();  // returns after drain_and_stop()'s stop(), the connections closed
  pthread_kill(waiter.native_handle(), SIGTERM);  // wakes the waiter if listen() failed itself
  waiter.join();
  const int left = server.still_in_flight();
  std::fprintf(stderr, "aotpack-serve: stopped (%d request(s) still in flight)\n", left);
  return left == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  // Blocked first, before any thread starts (every thread inherits the mask) and before the
  // models load: a SIGTERM during the load is taken once the server runs, and drains.
  const sigset_t stop_signals = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  keep_freed_memory();
  try {
    const Options opt = parse_args(argc, argv);
    if (opt.help) {
      std::fputs(kUsage, stdout);
      return 0;
    }
    return serve(opt);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "aotpack-serve: error: %s\n(run 'aotpack-serve --help' for usage)\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aotpack-serve: error: %s\n", e.what());
    return 1;
  }
}
