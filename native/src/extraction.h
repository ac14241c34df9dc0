// Where a verified archive lives on disk while a model uses it: an entry of the extraction
// cache ($XDG_CACHE_HOME/aotpack/runtime/<manifest sha256>/, docs/archive.md "Extraction
// cache"), shared by every load of that archive in this process, or a private folder when
// the cache is off or unusable.
#pragma once

#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "extract.h"
#include "safetensors.h"

namespace aotpack::detail {

struct CacheEntryState;  // extraction.cpp: one per cache entry this process uses

class Extraction {
 public:
  struct Options {
    std::vector<std::string> trusted_keys;
    bool verify_archive = false;  // read and hash every byte of the archive, even on a hit
    bool use_cache = true;        // false: a private folder; the cache is neither read nor written
  };

  /// Verifies `archive_path`'s manifest entries (digest, signature with trusted keys,
  /// limits) and returns its files: an entry of the cache, proven before use (every
  /// level of its path a folder owned by this user that no one else can write, every
  /// file's sha256 equal to the manifest's), or a new extraction, every file checked
  /// against the manifest's sha256 while it is written. A poisoned entry is moved aside
  /// and re-extracted. Every binary has passed its device's check_binary.
  /// `check(manifest)` runs before any file is written or reused and may throw to refuse
  /// it. `manifest` receives the parsed manifest. A new extraction is not in the cache
  /// until publish(). Throws aotpack::Error; nothing is left behind on error.
  static Extraction open(const std::string& archive_path, const Limits& limits,
                         const Options& options,
                         const std::function<void(const Manifest&)>& check, Manifest* manifest);

  /// The extraction cache's root, "" when it is off (AOTPACK_RUNTIME_CACHE=0) or no home
  /// folder is known. Not checked: see open().
  static std::string cache_root();

  /// Call once every check of the load has passed: a new extraction becomes the cache
  /// entry (renamed into place; loaded libraries keep working), and entries beyond
  /// AOTPACK_RUNTIME_CACHE_MB that no process uses are evicted, least recently used
  /// first. Errors leave the folder private; never throws.
  void publish() noexcept;

  const std::string& path() const { return path_; }
  /// weights.safetensors mapped copy-on-write (the mapping that was hashed, on a cache
  /// hit); null when the archive has none.
  const std::shared_ptr<MappedFile>& weights() const { return weights_; }

  Extraction() = default;
  Extraction(Extraction&& other) noexcept;
  Extraction& operator=(Extraction&& other) noexcept;
  Extraction(const Extraction&) = delete;
  Extraction& operator=(const Extraction&) = delete;
  ~Extraction();  // releases a cache entry; removes a private folder

 private:
  void release() noexcept;
  std::string path_;       // the folder holding the files
  std::string entry_;      // the cache entry this extraction is or may become; "" = none
  std::string lock_path_;  // a private folder's "<path>.lock", held by lock_fd_
  int lock_fd_ = -1;
  std::shared_ptr<CacheEntryState> state_;  // set with entry_
  std::unique_lock<std::mutex> proving_;    // held until publish(): other loads wait
  std::shared_ptr<MappedFile> weights_;
};

}  // namespace aotpack::detail
