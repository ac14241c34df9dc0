// aotpack-serve's models: the repository on disk (MODEL_DIR/<name>/<version>/*.aotpack,
// Triton's layout), each version's instances on their core partitions, the one request
// queue that feeds them, and the per-model metrics /metrics reports.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "aotpack/runtime.h"
#include "protocol.h"

namespace aotpack::serve {

/// A Prometheus histogram of durations in seconds (fixed buckets, 100 us to 10 s).
class Histogram {
 public:
  Histogram();
  void observe(double seconds);
  /// `name_bucket{labels,le="..."} n` lines, then _sum and _count.
  std::string text(const std::string& name, const std::string& labels) const;

 private:
  mutable std::mutex mutex_;
  std::vector<uint64_t> counts_;  // per bucket (not cumulative); the last is +Inf
  double sum_ = 0.0;
  uint64_t count_ = 0;
};

/// One version of one model: its instances (or why it did not load) and its counters.
class ModelVersion {
 public:
  /// Loads `instances` instances of `archive`, instance i pinned to partitions[i] (empty
  /// partitions: not pinned). A failed load leaves the version not ready with the error
  /// (ready() false, error() the message); it never throws.
  ModelVersion(std::string name, std::string version, std::string archive,
               const std::vector<std::vector<int32_t>>& partitions, size_t max_queue);
  /// A version that could not even be found (no archive or several): not ready.
  ModelVersion(std::string name, std::string version, std::string error);

  bool ready() const { return !instances_.empty(); }
  const std::string& error() const { return error_; }
  const Signature& signature() const { return signature_; }
  const std::string& name() const { return signature_.model; }
  const std::string& version() const { return signature_.version; }
  /// Load warnings of the instances (each once).
  const std::vector<std::string>& warnings() const { return warnings_; }
  /// The core partition of each instance ("0", "1", ... in cpulist form; "" = not pinned).
  std::vector<std::string> partitions() const;

  /// Waits for a free instance in arrival order, runs `inputs` on it and returns the
  /// outputs; records queue and compute time. Throws HttpError(503) when `max_queue`
  /// requests already wait, HttpError(500) when the run fails.
  std::vector<at::Tensor> infer(const std::vector<at::Tensor>& inputs);

  /// Counts a request that ended in an error before or after reaching infer().
  void count_request(bool failed);

  /// This version's lines of the /metrics text.
  std::string metrics_text() const;

 private:
  size_t acquire();
  void release(size_t index);

  Signature signature_;
  std::string archive_;
  std::string error_;
  std::vector<std::string> warnings_;
  std::vector<std::unique_ptr<Model>> instances_;
  size_t max_queue_ = 0;

  std::mutex mutex_;  // the request queue
  std::condition_variable freed_;
  std::vector<size_t> free_;     // idle instances
  uint64_t next_ticket_ = 0;     // the next arrival's place in the queue
  uint64_t serving_ticket_ = 0;  // the arrival served next (FIFO)
  size_t waiting_ = 0;

  std::atomic<uint64_t> requests_{0};
  std::atomic<uint64_t> failures_{0};
  Histogram queue_seconds_;
  Histogram compute_seconds_;
};

/// Every model version of a repository.
class Repository {
 public:
  /// Scans `root` (MODEL_DIR/<name>/<version>/ with one .aotpack per version folder; version
  /// folders are positive integers, other entries are skipped with a line on stderr) and
  /// loads each version; a version that fails to load is kept, not ready. Throws
  /// std::runtime_error only when `root` is not a readable folder.
  Repository(const std::string& root, const std::vector<std::vector<int32_t>>& partitions,
             size_t max_queue);

  /// The version a request names; `version` "" = the highest ready version (else the
  /// highest). Throws HttpError(404) naming the unknown model or version.
  ModelVersion& find(const std::string& model, const std::string& version);
  /// All versions of `model` (highest first); throws HttpError(404) for an unknown model.
  std::vector<ModelVersion*> versions(const std::string& model);
  /// True when every version loaded.
  bool all_ready() const;
  const std::vector<std::unique_ptr<ModelVersion>>& all() const { return versions_; }

 private:
  std::vector<std::unique_ptr<ModelVersion>> versions_;  // by name, then version ascending
};

}  // namespace aotpack::serve
