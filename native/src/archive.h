// Streaming reader of a .aotpack archive (one zstd-compressed tar): entry headers one at a
// time, entry data in caller-sized chunks, never a whole entry in memory; it reads the file
// only as far as the entries asked for (the manifest entries come first), and to its end
// when finish() is called. libzstd decodes the zstd layer, libarchive reads the tar.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

struct archive;

namespace aotpack::detail {

struct EntryHeader {
  std::string path;      // validated relative path ("model/model.so"), no trailing '/'
  bool regular = false;  // false: a plain directory (carries no data; callers skip it)
  uint64_t size = 0;     // bytes of data (regular files)
};

class ArchiveReader {
 public:
  /// Opens `archive_path` (a regular file). Throws aotpack::Error if it cannot be read.
  explicit ArchiveReader(const std::string& archive_path);
  ~ArchiveReader();
  ArchiveReader(const ArchiveReader&) = delete;
  ArchiveReader& operator=(const ArchiveReader&) = delete;

  /// The next entry's header; false at the end of the archive. Throws aotpack::Error on a
  /// corrupt archive, on one that is not compressed exactly once with zstd, on an unsafe
  /// path (check_entry_path), and on links, devices, FIFOs, sockets, sparse files and other
  /// non-regular entries. Unread data of the previous entry is skipped.
  bool next(EntryHeader* header);

  /// After next() returned false: decodes the rest of the zstd stream (checksums, a
  /// truncated frame), which may hold at most 1 MiB after the tar's end (the end-of-archive
  /// blocks, padding). Throws aotpack::Error "corrupt archive: ...".
  void finish();

  /// Up to `capacity` bytes of the current entry's data; 0 at its end. Throws on corruption.
  size_t read(void* buffer, size_t capacity);

  /// The whole current entry, which must be at most `max_bytes` (checked on its header
  /// size before reading). Throws naming `what`.
  std::string read_small(const EntryHeader& header, uint64_t max_bytes, const std::string& what);

 private:
  struct Source;
  std::unique_ptr<Source> source_;
  struct archive* archive_ = nullptr;
};

/// Throws unless `path` is a plain relative path: not empty, at most AOTPACK_MAX_PATH_BYTES
/// bytes and AOTPACK_MAX_PATH_COMPONENTS components of at most AOTPACK_MAX_NAME_BYTES, not
/// absolute, no "..", "." or empty components nor one starting with '.', only printable
/// ASCII other than space and backslash (aotpack/archive/manifest_rules.py's check_entry_path).
void check_entry_path(const std::string& path);

}  // namespace aotpack::detail
