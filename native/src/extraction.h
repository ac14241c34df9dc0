// Where a verified archive lives on disk while a model uses it: an entry of the extraction
// cache ($XDG_CACHE_HOME/aotpack/runtime/<manifest sha256>/, docs/archive.md "Extraction
// cache"), or a private folder when the cache is off or the entry is already in use in this
// process (a library loaded twice from one path would share its globals).
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "extract.h"

namespace aotpack::detail {

class Extraction {
 public:
  /// Verifies `archive_path`'s manifest entries (digest, signature with `trusted_keys`,
  /// limits) and returns its files: a complete cache entry for that manifest (re-checked:
  /// completion marker, manifest bytes, file sizes, ELF headers; only the archive's first
  /// entries are read) or a new extraction, every file checked against the manifest's
  /// sha256. Every .so has passed check_elf. `check(manifest)` runs before any file is
  /// written or reused and may throw to refuse it. `manifest` receives the parsed manifest. Throws aotpack::Error;
  /// nothing is left behind on error.
  static Extraction open(const std::string& archive_path, const Limits& limits,
                         const std::vector<std::string>& trusted_keys,
                         const std::function<void(const Manifest&)>& check, Manifest* manifest);

  /// The extraction cache's root, "" when it is off (AOTPACK_RUNTIME_CACHE=0) or no home
  /// folder is known.
  static std::string cache_root();

  const std::string& path() const { return path_; }

  Extraction() = default;
  Extraction(Extraction&& other) noexcept;
  Extraction& operator=(Extraction&& other) noexcept;
  Extraction(const Extraction&) = delete;
  Extraction& operator=(const Extraction&) = delete;
  ~Extraction();  // releases a cache entry; removes a private folder

 private:
  void release() noexcept;
  std::string path_;       // the folder holding the files
  std::string lock_path_;  // private folders under the cache: "<path>.lock", held by lock_fd_
  int lock_fd_ = -1;
  bool shared_ = false;  // a cache entry (claimed in this process) rather than a private folder
};

}  // namespace aotpack::detail
