#include "repository.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <sstream>

namespace aotpack::serve {

namespace fs = std::filesystem;

namespace {

// Bucket upper bounds in seconds: 100 us (a small model's run) to 10 s.
const std::vector<double> kBuckets = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                      0.025,  0.05,    0.1,    0.25,  0.5,    1.0,   2.5,
                                      5.0,    10.0};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string cpulist(const std::vector<int32_t>& cores) {
  std::string out;
  for (size_t i = 0; i < cores.size();) {
    size_t j = i;
    while (j + 1 < cores.size() && cores[j + 1] == cores[j] + 1) ++j;
    if (!out.empty()) out += ',';
    out += std::to_string(cores[i]);
    if (j > i) {
      out += '-';
      out += std::to_string(cores[j]);
    }
    i = j + 1;
  }
  return out;
}

// A Prometheus label value: backslash, quote and newline escaped.
std::string label_value(const std::string& value) {
  std::string out;
  for (char c : value) {
    if (c == '\\' || c == '"') out += '\\';
    if (c == '\n') {
      out += "\\n";
      continue;
    }
    out += c;
  }
  return out;
}

bool is_version_name(const std::string& name) {
  return !name.empty() && name.size() < 19 && name[0] != '0' &&
         std::all_of(name.begin(), name.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

// ---- Histogram ----

Histogram::Histogram() : counts_(kBuckets.size() + 1, 0) {}

void Histogram::observe(double seconds) {
  const size_t bucket = std::lower_bound(kBuckets.begin(), kBuckets.end(), seconds) - kBuckets.begin();
  std::lock_guard<std::mutex> lock(mutex_);
  ++counts_[bucket];
  sum_ += seconds;
  ++count_;
}

std::string Histogram::text(const std::string& name, const std::string& labels) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::ostringstream out;
  uint64_t cumulative = 0;
  for (size_t b = 0; b < counts_.size(); ++b) {
    cumulative += counts_[b];
    std::ostringstream le;
    if (b < kBuckets.size()) le << kBuckets[b];
    else le << "+Inf";
    out << name << "_bucket{" << labels << ",le=\"" << le.str() << "\"} " << cumulative << "\n";
  }
  out << name << "_sum{" << labels << "} " << sum_ << "\n";
  out << name << "_count{" << labels << "} " << count_ << "\n";
  return out.str();
}

// ---- ModelVersion ----

ModelVersion::ModelVersion(std::string name, std::string version, std::string archive,
                           const std::vector<std::vector<int32_t>>& partitions, size_t max_queue)
    : archive_(std::move(archive)), max_queue_(max_queue) {
  signature_.model = std::move(name);
  signature_.version = std::move(version);
  try {
    for (const std::vector<int32_t>& cores : partitions) {
      LoadOptions options;
      options.cores = cores;
      auto model = std::make_unique<Model>(Model::load(archive_, options));
      for (const std::string& w : model->warnings())
        if (std::find(warnings_.begin(), warnings_.end(), w) == warnings_.end()) warnings_.push_back(w);
      instances_.push_back(std::move(model));
    }
    for (const TensorSpec& spec : instances_.front()->inputs())
      if (datatype_name(spec.dtype).empty())
        throw Error("input '" + spec.name + "' has dtype " + dtype_name(spec.dtype) +
                    ", which the inference protocol cannot carry");
    signature_.inputs = instances_.front()->inputs();
    signature_.outputs = instances_.front()->outputs();
  } catch (const std::exception& e) {
    instances_.clear();
    error_ = e.what();
    return;
  }
  for (size_t i = 0; i < instances_.size(); ++i) free_.push_back(instances_.size() - 1 - i);
}

ModelVersion::ModelVersion(std::string name, std::string version, std::string error)
    : error_(std::move(error)) {
  signature_.model = std::move(name);
  signature_.version = std::move(version);
}

std::vector<std::string> ModelVersion::partitions() const {
  std::vector<std::string> out;
  for (const auto& m : instances_) out.push_back(cpulist(m->cores()));
  return out;
}

size_t ModelVersion::acquire() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (waiting_ >= max_queue_ && free_.empty())
    throw HttpError(503, "model '" + name() + "' version " + version() + ": " + std::to_string(waiting_) +
                             " request(s) already waiting (--max-queue " + std::to_string(max_queue_) +
                             "); retry later");
  const uint64_t ticket = next_ticket_++;
  ++waiting_;
  freed_.wait(lock, [&] { return ticket == serving_ticket_ && !free_.empty(); });
  --waiting_;
  ++serving_ticket_;
  const size_t index = free_.back();
  free_.pop_back();
  lock.unlock();
  freed_.notify_all();  // the next ticket may find another free instance
  return index;
}

void ModelVersion::release(size_t index) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    free_.push_back(index);
  }
  freed_.notify_all();
}

std::vector<at::Tensor> ModelVersion::infer(const std::vector<at::Tensor>& inputs) {
  const auto queued = std::chrono::steady_clock::now();
  const size_t index = acquire();
  queue_seconds_.observe(seconds_since(queued));
  struct Release {
    ModelVersion* self;
    size_t index;
    ~Release() { self->release(index); }
  } release{this, index};
  const auto start = std::chrono::steady_clock::now();
  try {
    std::vector<at::Tensor> outputs = instances_[index]->run(inputs);
    compute_seconds_.observe(seconds_since(start));
    return outputs;
  } catch (const std::exception& e) {
    compute_seconds_.observe(seconds_since(start));
    throw HttpError(500, e.what());
  }
}

void ModelVersion::count_request(bool failed) {
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (failed) failures_.fetch_add(1, std::memory_order_relaxed);
}

std::string ModelVersion::metrics_text() const {
  const std::string labels =
      "model=\"" + label_value(name()) + "\",version=\"" + label_value(version()) + "\"";
  std::ostringstream out;
  out << "aotpack_model_ready{" << labels << "} " << (ready() ? 1 : 0) << "\n";
  out << "aotpack_model_instances{" << labels << "} " << instances_.size() << "\n";
  out << "aotpack_inference_requests_total{" << labels << "} " << requests_.load() << "\n";
  out << "aotpack_inference_failures_total{" << labels << "} " << failures_.load() << "\n";
  out << queue_seconds_.text("aotpack_inference_queue_seconds", labels);
  out << compute_seconds_.text("aotpack_inference_compute_seconds", labels);
  return out.str();
}

// ---- Repository ----

Repository::Repository(const std::string& root, const std::vector<std::vector<int32_t>>& partitions,
                       size_t max_queue) {
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    throw std::runtime_error("MODEL_DIR '" + root + "' is not a folder");
  std::vector<fs::path> models;
  for (const auto& entry : fs::directory_iterator(root, ec))
    if (entry.is_directory() && entry.path().filename().string()[0] != '.') models.push_back(entry.path());
  if (ec) throw std::runtime_error("cannot list MODEL_DIR '" + root + "': " + ec.message());
  std::sort(models.begin(), models.end());
  for (const fs::path& model_dir : models) {
    const std::string name = model_dir.filename().string();
    std::vector<std::pair<long long, fs::path>> versions;
    for (const auto& entry : fs::directory_iterator(model_dir, ec)) {
      const std::string v = entry.path().filename().string();
      if (!entry.is_directory() || v[0] == '.') continue;
      if (!is_version_name(v)) {
        std::fprintf(stderr, "aotpack-serve: skipping %s: version folders are positive integers\n",
                     entry.path().c_str());
        continue;
      }
      versions.emplace_back(std::stoll(v), entry.path());
    }
    std::sort(versions.begin(), versions.end());
    if (versions.empty())
      std::fprintf(stderr, "aotpack-serve: model '%s' has no version folder (%s/1/MODEL.aotpack)\n",
                   name.c_str(), model_dir.c_str());
    for (const auto& [number, version_dir] : versions) {
      const std::string version = std::to_string(number);
      std::vector<fs::path> archives;
      for (const auto& entry : fs::directory_iterator(version_dir, ec))
        if (entry.path().extension() == ".aotpack") archives.push_back(entry.path());
      if (archives.size() != 1) {
        const std::string why = archives.empty() ? "no .aotpack file" : std::to_string(archives.size()) + " .aotpack files";
        versions_.push_back(std::make_unique<ModelVersion>(
            name, version, version_dir.string() + " holds " + why + "; a version folder holds exactly one"));
        continue;
      }
      versions_.push_back(
          std::make_unique<ModelVersion>(name, version, archives.front().string(), partitions, max_queue));
    }
  }
}

std::vector<ModelVersion*> Repository::versions(const std::string& model) {
  std::vector<ModelVersion*> out;
  for (const auto& v : versions_)
    if (v->name() == model) out.insert(out.begin(), v.get());
  if (out.empty()) throw HttpError(404, "unknown model '" + model + "'");
  return out;
}

ModelVersion& Repository::find(const std::string& model, const std::string& version) {
  const std::vector<ModelVersion*> all = versions(model);
  if (version.empty()) {
    for (ModelVersion* v : all)
      if (v->ready()) return *v;
    return *all.front();
  }
  for (ModelVersion* v : all)
    if (v->version() == version) return *v;
  std::string known;
  for (ModelVersion* v : all) known += (known.empty() ? "" : ", ") + v->version();
  throw HttpError(404, "model '" + model + "' has no version '" + version + "' (it has " + known + ")");
}

bool Repository::all_ready() const {
  return std::all_of(versions_.begin(), versions_.end(), [](const auto& v) { return v->ready(); });
}

}  // namespace aotpack::serve
