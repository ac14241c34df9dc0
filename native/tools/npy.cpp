#include "npy.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy code assumes a little-endian host");

namespace aotpack::npy {
namespace {

using c10::ScalarType;

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;

[[noreturn]] void fail(const std::string& message) { throw Error(message); }

struct Descr {
  ScalarType dtype;
  const char* code;  // without the byte-order character
};

constexpr Descr kDescrs[] = {
    {ScalarType::Float, "f4"}, {ScalarType::Double, "f8"}, {ScalarType::Half, "f2"},
    {ScalarType::Long, "i8"},  {ScalarType::Int, "i4"},    {ScalarType::Short, "i2"},
    {ScalarType::Char, "i1"},  {ScalarType::Byte, "u1"},   {ScalarType::Bool, "b1"},
};

ScalarType dtype_from_descr(const std::string& descr, const std::string& label) {
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string code = descr.substr(1);
    for (const Descr& d : kDescrs) {
      if (code != d.code) continue;
      const bool one_byte = code[1] == '1';
      if (order == '>' && !one_byte)
        fail(label + ": big-endian data ('" + descr +
             "') is not supported; use a little-endian array");
      if (order == '<' || order == '=' || (one_byte && (order == '|' || order == '>')))
        return d.dtype;
    }
  }
  fail(label + ": unsupported dtype '" + descr +
       "' (supported: <f4 <f8 <f2 <i8 <i4 <i2 |i1 |u1 |b1)");
}

// ---- the header is a Python dict literal:
//      {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }

class HeaderParser {
 public:
  HeaderParser(const std::string& text, const std::string& label) : s_(text), label_(label) {}

  void parse(std::string* descr, bool* fortran_order, std::vector<int64_t>* shape) {
    bool seen_descr = false, seen_order = false, seen_shape = false;
    expect('{');
    while (!peek_is('}')) {
      const std::string key = string_literal();
      expect(':');
      if (key == "descr") {
        *descr = string_literal();
        seen_descr = true;
      } else if (key == "fortran_order") {
        *fortran_order = boolean();
        seen_order = true;
      } else if (key == "shape") {
        *shape = int_tuple();
        seen_shape = true;
      } else {
        bad("unexpected key '" + key + "'");
      }
      if (!peek_is('}')) expect(',');
    }
    expect('}');
    if (!seen_descr || !seen_order || !seen_shape) bad("missing descr, fortran_order or shape");
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(label_ + ": malformed .npy header (" + what + ")");
  }
  void skip_space() {
    while (pos_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[pos_]))) ++pos_;
  }
  bool peek_is(char c) {
    skip_space();
    return pos_ < s_.size() && s_[pos_] == c;
  }
  void expect(char c) {
    if (!peek_is(c)) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_space();
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) bad("expected a string");
    const char quote = s_[pos_++];
    const size_t end = s_.find(quote, pos_);
    if (end == std::string::npos) bad("unterminated string");
    std::string value = s_.substr(pos_, end - pos_);
    pos_ = end + 1;
    return value;
  }
  bool boolean() {
    skip_space();
    for (bool value : {true, false}) {
      const std::string word = value ? "True" : "False";
      if (s_.compare(pos_, word.size(), word) == 0) {
        pos_ += word.size();
        return value;
      }
    }
    bad("expected True or False");
  }
  std::vector<int64_t> int_tuple() {
    std::vector<int64_t> values;
    expect('(');
    while (!peek_is(')')) {
      size_t digits = 0;
      int64_t value = 0;
      while (pos_ < s_.size() && std::isdigit(static_cast<unsigned char>(s_[pos_]))) {
        if (value > (INT64_MAX - 9) / 10) bad("dimension too large");
        value = value * 10 + (s_[pos_++] - '0');
        ++digits;
      }
      if (digits == 0) bad("expected a dimension");
      values.push_back(value);
      if (!peek_is(')')) expect(',');
    }
    expect(')');
    return values;
  }

  const std::string& s_;
  const std::string& label_;
  size_t pos_ = 0;
};

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

Array parse(const std::string& bytes, const std::string& label) {
  if (bytes.size() < 10 || bytes.compare(0, kMagicLen, kMagic) != 0)
    fail(label + ": not a .npy file (bad magic)");
  const int major = static_cast<unsigned char>(bytes[6]);
  if (major < 1 || major > 3)
    fail(label + ": unsupported .npy format version " + std::to_string(major));
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (bytes.size() < 8 + len_bytes) fail(label + ": truncated .npy header");
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i)
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  const size_t data_start = 8 + len_bytes + header_len;
  if (data_start > bytes.size()) fail(label + ": truncated .npy header");
  const std::string header = bytes.substr(8 + len_bytes, header_len);

  std::string descr;
  bool fortran_order = false;
  Array array;
  HeaderParser(header, label).parse(&descr, &fortran_order, &array.shape);
  array.fortran_order = fortran_order;
  array.dtype = dtype_from_descr(descr, label);
  const uint64_t nbytes = nbytes_of(array.dtype, array.shape, label);
  if (bytes.size() - data_start != nbytes)
    fail(label + ": holds " + std::to_string(bytes.size() - data_start) + " data bytes, " +
         describe(array.dtype, array.shape) + " needs " + std::to_string(nbytes));
  array.data = bytes.substr(data_start);
  return array;
}

Array read(const std::string& path) {
  // Only a regular file, read to its size: /dev/zero, a FIFO or a terminal is an error,
  // never an endless read.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail("cannot read '" + path + "': not a regular file");
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::read(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      ::close(fd);
      fail("cannot read '" + path + "'" + (n < 0 ? std::string(": ") + std::strerror(errno) : ": it shrank"));
    }
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return parse(content, path);
}

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
