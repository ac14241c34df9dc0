// A private folder (mode 0700) that the archive is extracted to, removed on destruction.
#pragma once

#include <string>

namespace aotpack::detail {

class TempDir {
 public:
  /// Creates $TMPDIR/aotpack-XXXXXX (or /tmp/...) with mkdtemp; throws aotpack::Error.
  static TempDir create();

  /// Writes `data` to `relative_path` (already validated), creating parent folders (0700).
  /// The file must not exist yet. mode: e.g. 0755 for .so files, 0644 otherwise.
  void write_file(const std::string& relative_path, const std::string& data, unsigned mode) const;

  const std::string& path() const { return path_; }

  TempDir() = default;
  TempDir(TempDir&& other) noexcept;
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  ~TempDir();  // removes the folder and everything in it; errors are ignored

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}
  void remove() noexcept;
  std::string path_;
};

}  // namespace aotpack::detail
