// A private folder (mode 0700) that the archive is extracted to, removed on destruction.
#pragma once

#include <string>

namespace aotpack::detail {

/// Creates `root/relative_path` (already validated) for writing, with its parent folders
/// (0700); the file must not exist yet (O_EXCL, no symlinks followed). Returns the file
/// descriptor; throws aotpack::Error.
int create_new_file(const std::string& root, const std::string& relative_path, unsigned mode);

/// Writes all of `data` to `fd`; `path` names it in errors. Throws aotpack::Error.
void write_all(int fd, const char* data, size_t size, const std::string& path);

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
