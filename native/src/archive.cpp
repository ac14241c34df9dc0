#include "archive.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "aotpack/archive_layout.h"
#include "util.h"

namespace aotpack::detail {
namespace {

constexpr size_t kBlock = 1 << 16;
constexpr uint64_t kTailLimit = 1 << 20;  // decoded bytes allowed after the tar (reader.py's _RING)

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
// zstd's format (aotpack/archive/reader.py's _is_zstd).
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

// The zstd layer, decoded here rather than by libarchive's filter so that the stream is
// read to its end after the tar's (libarchive stops at the end-of-archive block): the
// same decoding as aotpack/archive/reader.py's _Zstd (libzstd there too), frame after frame,
// skippable frames skipped, checksums verified, a stream ending inside a frame refused.
// libarchive reads the decoded tar through read_cb.
struct ArchiveReader::Source {
  int fd = -1;
  ZSTD_DStream* zstd = ZSTD_createDStream();
  std::vector<char> in = std::vector<char>(kBlock);
  ZSTD_inBuffer input{in.data(), 0, 0};
  std::vector<char> out = std::vector<char>(ZSTD_DStreamOutSize());  // a whole block: no copy inside zstd
  std::string pending;  // decoded before libarchive asked for it (the layer check)
  size_t pending_at = 0;
  size_t frame_left = 0;  // ZSTD_decompressStream's last hint: 0 at a frame's end
  bool started = false, file_end = false;
  uint64_t decoded = 0;  // bytes decoded so far
  std::string error;

  ~Source() {
    if (fd >= 0) ::close(fd);
    ZSTD_freeDStream(zstd);
  }

  // Decodes up to `capacity` bytes into `buffer`: the count, 0 at the stream's end, -1 on
  // an error (in `error`). Never throws: libarchive's C frames are between it and a catch.
  ssize_t decode(char* buffer, size_t capacity) {
    for (;;) {
      if (input.pos == input.size && !file_end) {
        const ssize_t n = read_fd(fd, in.data(), in.size());
        if (n < 0) return failed(std::strerror(errno));
        file_end = n == 0;
        input = {in.data(), static_cast<size_t>(n), 0};
        started = started || n > 0;
      }
      // Also with no input left: the decoder may hold output a full buffer stopped.
      ZSTD_outBuffer output{buffer, capacity, 0};
      const size_t consumed = input.pos;
      const size_t hint = ZSTD_decompressStream(zstd, &output, &input);
      if (ZSTD_isError(hint)) return failed(std::string("zstd decompressor error: ") + ZSTD_getErrorName(hint));
      if (output.pos > 0 || input.pos > consumed) frame_left = hint;  // else: between frames, no input
      decoded += output.pos;
      if (output.pos > 0) return static_cast<ssize_t>(output.pos);
      if (file_end && input.pos == input.size) break;
    }
    if (started && frame_left != 0) return failed("Truncated zstd input");
    return 0;
  }

  ssize_t failed(const std::string& why) {
    error = why;
    return -1;
  }

  // Decodes into `pending` until it holds `size` bytes or the stream ends. Throws.
  void fill(size_t size) {
    while (pending.size() < size) {
      const ssize_t n = decode(out.data(), out.size());
      if (n < 0) fail("corrupt archive: " + error);
      if (n == 0) return;
      pending.append(out.data(), static_cast<size_t>(n));
    }
  }

  // Whether the decoded stream is zstd again: a zstd frame, possibly after skippable
  // frames within its first MiB (aotpack/archive/reader.py's _inner_zstd). Throws.
  bool inner_zstd() {
    uint64_t offset = 0;
    while (offset < kTailLimit) {
      fill(static_cast<size_t>(offset) + 8);
      const auto* head = reinterpret_cast<const unsigned char*>(pending.data()) + offset;
      const uint64_t have = pending.size() - offset;
      if (have >= 4 && head[0] == 0x28 && head[1] == 0xb5 && head[2] == 0x2f && head[3] == 0xfd) return true;
      if (have < 8 || !is_zstd_magic(head)) return false;
      offset += 8 + (uint64_t{head[4]} | uint64_t{head[5]} << 8 | uint64_t{head[6]} << 16 | uint64_t{head[7]} << 24);
    }
    return false;
  }

  static la_ssize_t read_cb(struct archive* a, void* self, const void** data) {
    auto* source = static_cast<Source*>(self);
    if (source->pending_at < source->pending.size()) {
      *data = source->pending.data() + source->pending_at;
      const size_t n = source->pending.size() - source->pending_at;
      source->pending_at = source->pending.size();
      return static_cast<la_ssize_t>(n);
    }
    const ssize_t n = source->decode(source->out.data(), source->out.size());
    if (n < 0) {
      archive_set_error(a, EIO, "%s", source->error.c_str());
      return -1;
    }
    *data = source->out.data();
    return n;
  }
};

ArchiveReader::ArchiveReader(const std::string& archive_path) : source_(std::make_unique<Source>()) {
  source_->fd = ::open(archive_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (source_->fd < 0) fail(std::strerror(errno));
  struct stat st{};
  if (fstat(source_->fd, &st) != 0) fail(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) fail("not a regular file");
  if (!source_->zstd) fail("out of memory creating the zstd decoder");
  unsigned char magic[4] = {};
  if (::pread(source_->fd, magic, sizeof magic, 0) != sizeof magic || !is_zstd_magic(magic))
    fail("not zstd-compressed (an .aotpack archive is a zstd-compressed tar)");
  if (source_->inner_zstd()) fail("compressed more than once (an .aotpack archive is zstd over tar)");
  archive_ = archive_read_new();
  if (!archive_) fail("out of memory creating the archive reader");
  archive_read_support_format_tar(archive_);  // no filter: the zstd layer is decoded above
  if (archive_read_open(archive_, source_.get(), nullptr, &Source::read_cb, nullptr) != ARCHIVE_OK)
    fail("corrupt archive: " + libarchive_error(archive_));
}

ArchiveReader::~ArchiveReader() {
  if (archive_) archive_read_free(archive_);
}

bool ArchiveReader::next(EntryHeader* header) {
  struct archive_entry* entry = nullptr;
  int rc = archive_read_next_header(archive_, &entry);
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

void ArchiveReader::finish() {
  // What the tar reader has not consumed yet, plus the rest of the stream.
  const int64_t consumed = archive_filter_bytes(archive_, 0);
  uint64_t tail = source_->decoded - static_cast<uint64_t>(consumed > 0 ? consumed : 0);
  for (;;) {
    const ssize_t n = source_->decode(source_->out.data(), source_->out.size());
    if (n < 0) fail("corrupt archive: " + source_->error);
    if (n == 0) return;
    tail += static_cast<uint64_t>(n);
    if (tail > kTailLimit) fail("corrupt archive: more than 1 MiB of data after the end of the tar");
  }
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
