#include "archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <set>

#include "util.h"

namespace aotpack::detail {
namespace {

using ArchivePtr = std::unique_ptr<struct archive, int (*)(struct archive*)>;

std::string libarchive_error(struct archive* a) {
  const char* message = archive_error_string(a);
  return message ? message : "unknown libarchive error";
}

ArchivePtr open_reader(const std::string& archive_path) {
  struct stat st{};
  if (stat(archive_path.c_str(), &st) != 0) fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");

  ArchivePtr a(archive_read_new(), archive_read_free);
  if (!a) fail("out of memory creating the archive reader");
  archive_read_support_filter_zstd(a.get());
  archive_read_support_format_tar(a.get());
  if (archive_read_open_filename(a.get(), archive_path.c_str(), 1 << 16) != ARCHIVE_OK)
    fail("not a readable tar.zst archive: " + libarchive_error(a.get()));
  return a;
}

// Only regular files carry data; a plain directory entry is harmless and skipped.
bool is_regular_file(struct archive_entry* entry, const std::string& path) {
  if (archive_entry_hardlink(entry) != nullptr) fail("entry '" + path + "' is a hard link");
  switch (archive_entry_filetype(entry)) {
    case AE_IFREG: return true;
    case AE_IFDIR: return false;
    case AE_IFLNK: fail("entry '" + path + "' is a symbolic link");
    case AE_IFCHR:
    case AE_IFBLK: fail("entry '" + path + "' is a device");
    case AE_IFIFO: fail("entry '" + path + "' is a FIFO");
    case AE_IFSOCK: fail("entry '" + path + "' is a socket");
    default: fail("entry '" + path + "' has an unsupported file type");
  }
}

std::string read_entry_data(struct archive* a, struct archive_entry* entry,
                            const std::string& path) {
  if (!archive_entry_size_is_set(entry) || archive_entry_size(entry) < 0)
    fail("entry '" + path + "' has no valid size");
  std::string data(static_cast<size_t>(archive_entry_size(entry)), '\0');
  size_t done = 0;
  while (done < data.size()) {
    la_ssize_t n = archive_read_data(a, data.data() + done, data.size() - done);
    if (n < 0) fail("cannot read entry '" + path + "': " + libarchive_error(a));
    if (n == 0) fail("entry '" + path + "' is truncated");
    done += static_cast<size_t>(n);
  }
  return data;
}

}  // namespace

void check_entry_path(const std::string& path) {
  if (path.empty()) fail("entry with an empty path");
  if (path.front() == '/') fail("entry '" + path + "' has an absolute path");
  for (unsigned char c : path)
    if (c < 0x20 || c == 0x7f || c == '\\')
      fail("entry '" + path + "' has a control character or backslash in its path");
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part == "..") fail("entry '" + path + "' has a '..' component");
    if (part.empty() || part == ".") fail("entry '" + path + "' is not a normalised relative path");
    start = end + 1;
  }
}

std::vector<ArchiveEntry> read_archive(const std::string& archive_path) {
  ArchivePtr a = open_reader(archive_path);
  std::vector<ArchiveEntry> entries;
  std::set<std::string> seen;
  struct archive_entry* entry = nullptr;
  for (;;) {
    int rc = archive_read_next_header(a.get(), &entry);
    if (rc == ARCHIVE_EOF) break;
    if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN)
      fail("corrupt archive: " + libarchive_error(a.get()));
    const char* raw = archive_entry_pathname(entry);
    std::string path = raw ? raw : "";
    bool regular = is_regular_file(entry, path);
    if (!regular && path.size() > 1 && path.back() == '/') path.pop_back();
    check_entry_path(path);
    if (!regular) continue;
    if (!seen.insert(path).second) fail("entry '" + path + "' appears twice");
    entries.push_back({path, read_entry_data(a.get(), entry, path)});
  }
  return entries;
}

}  // namespace aotpack::detail
