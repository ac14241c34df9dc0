#include "npy.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "../src/npy_format.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy code assumes a little-endian host");

namespace aotpack::npy {
namespace {

using c10::ScalarType;

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

uint64_t nbytes_of(ScalarType dtype, const std::vector<int64_t>& shape, const std::string& label) {
  uint64_t total = c10::elementSize(dtype);
  for (int64_t d : shape) {
    if (d != 0 && total > UINT64_MAX / static_cast<uint64_t>(d)) fail(label + ": shape too large");
    total *= static_cast<uint64_t>(d);
  }
  return total;
}

std::string header_dict(ScalarType dtype, const std::vector<int64_t>& shape) {
  const char* code = nullptr;
  for (const Descr& d : kDescrs)
    if (d.dtype == dtype) code = d.code;
  if (!code) fail("dtype " + dtype_name(dtype) + " has no .npy equivalent");
  const char order = code[1] == '1' ? '|' : '<';
  std::string dims;
  for (int64_t d : shape) dims += std::to_string(d) + ", ";
  if (shape.size() > 1)
    dims.resize(dims.size() - 2);  // (2, 3) but (5,)
  else if (shape.size() == 1)
    dims.pop_back();
  return std::string("{'descr': '") + order + code + "', 'fortran_order': False, 'shape': (" +
         dims + "), }";
}

void append_le(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xff);
}

// ---- npz ----

using WriterPtr = std::unique_ptr<struct archive, int (*)(struct archive*)>;

void check(int rc, struct archive* a, const std::string& path) {
  if (rc != ARCHIVE_OK) {
    const char* why = archive_error_string(a);
    fail("cannot write '" + path + "': " + (why ? why : "libarchive error"));
  }
}

void write_member(struct archive* a, const std::string& name, const std::string& bytes,
                  const std::string& path) {
  std::unique_ptr<struct archive_entry, void (*)(struct archive_entry*)> entry(archive_entry_new(),
                                                                               archive_entry_free);
  archive_entry_set_pathname(entry.get(), (name + ".npy").c_str());
  archive_entry_set_filetype(entry.get(), AE_IFREG);
  archive_entry_set_perm(entry.get(), 0644);
  archive_entry_set_size(entry.get(), static_cast<la_int64_t>(bytes.size()));
  archive_entry_set_mtime(entry.get(), 315532800, 0);  // 1980-01-01, the earliest zip time
  check(archive_write_header(a, entry.get()), a, path);
  if (archive_write_data(a, bytes.data(), bytes.size()) != static_cast<la_ssize_t>(bytes.size()))
    check(ARCHIVE_FATAL, a, path);
}

void write_zip_to_fd(int fd, const std::vector<std::pair<std::string, std::string>>& members,
                     const std::string& path) {
  WriterPtr a(archive_write_new(), archive_write_free);
  if (!a) fail("out of memory creating the zip writer");
  check(archive_write_set_format_zip(a.get()), a.get(), path);
  check(archive_write_set_options(a.get(), "zip:compression=store"), a.get(), path);
  check(archive_write_open_fd(a.get(), fd), a.get(), path);
  for (const auto& [name, bytes] : members) write_member(a.get(), name, bytes, path);
  check(archive_write_close(a.get()), a.get(), path);
}

}  // namespace

std::string encode(c10::ScalarType dtype, const std::vector<int64_t>& shape, const void* data,
                   size_t nbytes) {
  if (nbytes != nbytes_of(dtype, shape, "npy")) fail("npy encode: data size does not match shape");
  std::string dict = header_dict(dtype, shape);
  // Pad with spaces and end with '\n' so the data starts at a multiple of 64 bytes.
  const bool v1 = dict.size() + 1 + 10 <= 65535;
  const size_t prefix = v1 ? 10 : 12;
  dict.append((64 - (prefix + dict.size() + 1) % 64) % 64, ' ');
  dict += '\n';
  std::string out(kMagic, kMagicLen);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  append_le(out, dict.size(), v1 ? 2 : 4);
  out += dict;
  out.append(static_cast<const char*>(data), nbytes);
  return out;
}

void write_npz(const std::string& path,
               const std::vector<std::pair<std::string, std::string>>& named_npy_files) {
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash);
  const std::string base = slash == std::string::npos ? path : path.substr(slash + 1);
  std::string temp = dir + "/." + base + ".tmp-XXXXXX";
  int fd = mkstemp(temp.data());
  if (fd < 0) fail("cannot create a temp file in '" + dir + "': " + std::strerror(errno));
  try {
    write_zip_to_fd(fd, named_npy_files, path);
    if (fsync(fd) != 0) fail("cannot sync '" + temp + "': " + std::strerror(errno));
    if (fchmod(fd, 0644) != 0) fail("cannot chmod '" + temp + "': " + std::strerror(errno));
    const int rc = close(fd);
    fd = -1;
    if (rc != 0) fail("cannot close '" + temp + "': " + std::strerror(errno));
    if (rename(temp.c_str(), path.c_str()) != 0)
      fail("cannot rename '" + temp + "' to '" + path + "': " + std::strerror(errno));
  } catch (...) {
    if (fd >= 0) close(fd);
    unlink(temp.c_str());
    throw;
  }
}

}  // namespace aotpack::npy
