#include "archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "aotpack/archive_layout.h"
#include "util.h"

namespace aotpack::detail {
namespace {

constexpr size_t kBlock = 1 << 16;

std::string libarchive_error(struct archive* a) {
  const char* message = archive_error_string(a);
  return message ? message : "unknown libarchive error";
}

// Only regular files carry data; a plain directory entry is harmless and skipped.
bool is_regular_file(struct archive_entry* entry, const std::string& path) {
  if (archive_entry_hardlink(entry) != nullptr) fail("entry '" + path + "' is a hard link");
  switch (archive_entry_filetype(entry)) {
    case AE_IFREG:
      // A sparse entry's data are not its bytes (holes are zeros, its header size not
      // what is stored); libarchive counts a map of one region covering the file as none.
      if (archive_entry_sparse_count(entry) > 0) fail("entry '" + path + "' is a sparse file");
      return true;
    case AE_IFDIR: return false;
    case AE_IFLNK: fail("entry '" + path + "' is a symbolic link");
    case AE_IFCHR:
    case AE_IFBLK: fail("entry '" + path + "' is a device");
    case AE_IFIFO: fail("entry '" + path + "' is a FIFO");
    case AE_IFSOCK: fail("entry '" + path + "' is a socket");
    default: fail("entry '" + path + "' has an unsupported file type");
  }
}

// A zstd frame (28 b5 2f fd) or a skippable frame (5? 2a 4d 18) starts the file: both are
// zstd's format (aotpack/reader.py's _is_zstd).
bool is_zstd_magic(const unsigned char* m) {
  return (m[0] == 0x28 && m[1] == 0xb5 && m[2] == 0x2f && m[3] == 0xfd) ||
         ((m[0] & 0xf0) == 0x50 && m[1] == 0x2a && m[2] == 0x4d && m[3] == 0x18);
}

ssize_t read_fd(int fd, void* buffer, size_t size) {
  for (;;) {
    ssize_t n = ::read(fd, buffer, size);
    if (n >= 0 || errno != EINTR) return n;
  }
}

}  // namespace

// The file descriptor libarchive reads through, in fixed blocks.
struct ArchiveReader::Source {
  int fd = -1;
  std::vector<char> block = std::vector<char>(kBlock);
  ~Source() {
    if (fd >= 0) ::close(fd);
  }
  static la_ssize_t read_cb(struct archive* a, void* self, const void** out) {
    auto* source = static_cast<Source*>(self);
    ssize_t n = read_fd(source->fd, source->block.data(), source->block.size());
    if (n < 0) {
      archive_set_error(a, errno, "%s", std::strerror(errno));
      return -1;
    }
    *out = source->block.data();
    return n;
  }
};

ArchiveReader::ArchiveReader(const std::string& archive_path) : source_(std::make_unique<Source>()) {
  source_->fd = ::open(archive_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (source_->fd < 0) fail(std::strerror(errno));
  struct stat st{};
  if (fstat(source_->fd, &st) != 0) fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  archive_ = archive_read_new();
  if (!archive_) fail("out of memory creating the archive reader");
  archive_read_support_filter_zstd(archive_);
  archive_read_support_format_tar(archive_);
  unsigned char magic[4] = {};
  if (::pread(source_->fd, magic, sizeof magic, 0) != sizeof magic || !is_zstd_magic(magic))
    fail("not zstd-compressed (an .aotpack archive is a zstd-compressed tar)");
  if (archive_read_open(archive_, source_.get(), nullptr, &Source::read_cb, nullptr) != ARCHIVE_OK)
    fail("corrupt archive: " + libarchive_error(archive_));
}

ArchiveReader::~ArchiveReader() {
  if (archive_) archive_read_free(archive_);
}

bool ArchiveReader::next(EntryHeader* header) {
  struct archive_entry* entry = nullptr;
  int rc = archive_read_next_header(archive_, &entry);
  if (!checked_filters_) {
    // Exactly one zstd layer over the tar: filter 0 is zstd, filter 1 the raw file (also
    // when the inner layer fails to decode: it is still a second layer).
    checked_filters_ = true;
    if (archive_filter_count(archive_) > 2)
      fail("compressed more than once (an .aotpack archive is zstd over tar)");
    if (rc == ARCHIVE_OK || rc == ARCHIVE_WARN || rc == ARCHIVE_EOF) {
      if (archive_filter_code(archive_, 0) != ARCHIVE_FILTER_ZSTD)
        fail("not zstd-compressed (an .aotpack archive is a zstd-compressed tar)");
      if (archive_filter_count(archive_) != 2)
        fail("compressed more than once (an .aotpack archive is zstd over tar)");
    }
  }
  if (rc == ARCHIVE_EOF) return false;
  if (rc != ARCHIVE_OK && rc != ARCHIVE_WARN) fail("corrupt archive: " + libarchive_error(archive_));
  const char* raw = archive_entry_pathname(entry);
  std::string path = raw ? raw : "";
  header->regular = is_regular_file(entry, path);
  if (!header->regular)
    while (!path.empty() && path.back() == '/') path.pop_back();
  check_entry_path(path);
  header->path = path;
  header->size = 0;
  if (header->regular) {
    if (!archive_entry_size_is_set(entry) || archive_entry_size(entry) < 0)
      fail("entry '" + path + "' has no valid size");
    header->size = static_cast<uint64_t>(archive_entry_size(entry));
  }
  return true;
}

size_t ArchiveReader::read(void* buffer, size_t capacity) {
  la_ssize_t n = archive_read_data(archive_, buffer, capacity);
  if (n < 0) fail("corrupt archive: " + libarchive_error(archive_));
  return static_cast<size_t>(n);
}

std::string ArchiveReader::read_small(const EntryHeader& header, uint64_t max_bytes,
                                      const std::string& what) {
  if (header.size > max_bytes)
    fail(what + " is " + std::to_string(header.size) + " bytes, more than the limit of " +
         std::to_string(max_bytes));
  std::string data(static_cast<size_t>(header.size), '\0');
  size_t done = 0;
  while (done < data.size()) {
    size_t n = read(data.data() + done, data.size() - done);
    if (n == 0) fail("entry '" + header.path + "' is truncated");
    done += n;
  }
  return data;
}

void check_entry_path(const std::string& path) {
  if (path.empty()) fail("entry with an empty path");
  if (path.size() > AOTPACK_MAX_PATH_BYTES)
    fail("entry with a path longer than " + std::to_string(AOTPACK_MAX_PATH_BYTES) + " bytes");
  if (path.front() == '/') fail("entry '" + path + "' has an absolute path");
  for (unsigned char c : path)
    if (c <= 0x20 || c >= 0x7f || c == '\\')
      fail("entry '" + path + "' has a space, control, non-ASCII or backslash character in its path");
  uint64_t components = 0;
  size_t start = 0;
  while (start <= path.size()) {
    size_t end = path.find('/', start);
    if (end == std::string::npos) end = path.size();
    const std::string part = path.substr(start, end - start);
    if (part == "..") fail("entry '" + path + "' has a '..' component");
    if (part.empty() || part == ".") fail("entry '" + path + "' is not a normalised relative path");
    if (part.front() == '.') fail("entry '" + path + "' has a component starting with '.'");
    if (part.size() > AOTPACK_MAX_NAME_BYTES)
      fail("entry '" + path + "' has a component longer than " + std::to_string(AOTPACK_MAX_NAME_BYTES) +
           " bytes");
    ++components;
    start = end + 1;
  }
  if (components > AOTPACK_MAX_PATH_COMPONENTS)
    fail("entry '" + path + "' has more than " + std::to_string(AOTPACK_MAX_PATH_COMPONENTS) + " components");
}

}  // namespace aotpack::detail
