// Reading a .aotpack archive (tar, zstd-compressed) into memory, refusing unsafe entries.
#pragma once

#include <string>
#include <vector>

namespace aotpack::detail {

struct ArchiveEntry {
  std::string path;  // validated relative path (e.g. AOTPACK_MODEL_LIBRARY_PATH)
  std::string data;  // the whole file content
};

/// Reads every regular-file entry of `archive_path`, in archive order. Directory entries
/// are skipped (the runtime creates folders itself). Throws aotpack::Error on I/O or format
/// errors, on an unsafe path (see check_entry_path), on links, devices, FIFOs and sockets,
/// and on a path that appears twice. Nothing is written to disk.
std::vector<ArchiveEntry> read_archive(const std::string& archive_path);

/// Throws unless `path` is a plain relative path: not empty, not absolute, no "..", "." or
/// empty components, no backslash or control characters.
void check_entry_path(const std::string& path);

}  // namespace aotpack::detail
