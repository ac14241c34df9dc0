#include "npy.h"

#include <ATen/ops/empty.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>

#include "aotpack/runtime.h"
#include "npy_format.h"
#include "util.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the .npy reader assumes a little-endian host");

namespace aotpack::npy {
namespace {

using c10::ScalarType;
using detail::fail;

ScalarType dtype_from_descr(const std::string& descr, const std::string& label) {
  if (descr.size() == 3) {
    const char order = descr[0];
    const std::string code = descr.substr(1);
    for (const Descr& d : kDescrs) {
      if (code != d.code) continue;
      const bool one_byte = code[1] == '1';
      if (order == '>' && !one_byte)
        fail(label + ": big-endian data ('" + descr +
             "') is not supported; save a little-endian array (a.astype(a.dtype.newbyteorder('<')))");
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
      if (pos_ == s_.size()) bad("no closing '}'");
      const std::string key = string_literal();
      expect(':');
      bool* seen = nullptr;
      if (key == "descr") {
        if (peek_is('['))
          fail(label_ + ": structured arrays (a list of fields as descr) are not supported; "
                        "save each field as its own array");
        *descr = string_literal();
        seen = &seen_descr;
      } else if (key == "fortran_order") {
        *fortran_order = boolean();
        seen = &seen_order;
      } else if (key == "shape") {
        *shape = int_tuple();
        seen = &seen_shape;
      } else {
        bad("unexpected key '" + key + "'");
      }
      if (*seen) bad("key '" + key + "' appears twice");
      *seen = true;
      if (!peek_is('}')) expect(',');
    }
    expect('}');
    skip_space();
    if (pos_ != s_.size()) bad("text after the closing '}'");
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
      if (values.size() == kMaxDims)
        fail(label_ + ": more than " + std::to_string(kMaxDims) + " dimensions");
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

struct Preamble {
  uint64_t header_start = 0;  // where the dict starts
  uint64_t data_offset = 0;   // where it ends and the data starts
};

// Magic, version and header length, from the first bytes of a file of `file_size` bytes
// (`prefix` holds at least its first 12 bytes, or all of a shorter file).
Preamble preamble(const std::string& prefix, uint64_t file_size, const std::string& label) {
  if (file_size == 0) fail(label + ": not a .npy file (it is empty)");
  if (prefix.compare(0, 2, "PK") == 0)
    fail(label + ": not a .npy file (it is a zip, e.g. an .npz: pass each array as its own .npy file)");
  if (prefix.size() < kMagicLen || prefix.compare(0, kMagicLen, kMagic) != 0)
    fail(label + ": not a .npy file (bad magic)");
  if (prefix.size() < kMagicLen + 2) fail(label + ": truncated .npy header");
  const int major = static_cast<unsigned char>(prefix[kMagicLen]);
  if (major < 1 || major > 3)
    fail(label + ": unsupported .npy format version " + std::to_string(major));
  Preamble p;
  const size_t len_bytes = major == 1 ? 2 : 4;
  p.header_start = kMagicLen + 2 + len_bytes;
  if (prefix.size() < p.header_start) fail(label + ": truncated .npy header");
  uint64_t header_len = 0;
  for (size_t i = 0; i < len_bytes; ++i)
    header_len |= static_cast<uint64_t>(static_cast<unsigned char>(prefix[kMagicLen + 2 + i]))
                  << (8 * i);
  if (header_len > kMaxHeaderBytes)
    fail(label + ": its .npy header is " + std::to_string(header_len) + " bytes, over the " +
         std::to_string(kMaxHeaderBytes) + "-byte limit");
  p.data_offset = p.header_start + header_len;
  if (p.data_offset > file_size) fail(label + ": truncated .npy header");
  return p;
}

// The tensor the data is read into: row-major over the file's order (for Fortran order,
// the reversed shape).
at::Tensor storage_for(const Header& header) {
  std::vector<int64_t> shape = header.shape;
  if (header.fortran_order) std::reverse(shape.begin(), shape.end());
  return at::empty(shape, at::TensorOptions().dtype(header.dtype));
}

// Checks the data read into `storage` and returns it in row-major order of the shape.
at::Tensor finish(const Header& header, at::Tensor storage, const std::string& label) {
  if (header.dtype == ScalarType::Bool) {
    const auto* bytes = static_cast<const unsigned char*>(storage.data_ptr());
    if (std::any_of(bytes, bytes + header.data_bytes, [](unsigned char b) { return b > 1; }))
      fail(label + ": bool data holds a byte other than 0 or 1");
  }
  if (!header.fortran_order || header.shape.size() < 2) return storage;
  std::vector<int64_t> reverse_dims(header.shape.size());
  for (size_t i = 0; i < reverse_dims.size(); ++i)
    reverse_dims[i] = static_cast<int64_t>(reverse_dims.size() - 1 - i);
  return storage.permute(reverse_dims).contiguous();
}

// Reads exactly `n` bytes at `offset` into `out`.
void read_exact(int fd, uint64_t offset, void* out, uint64_t n, const std::string& path) {
  auto* p = static_cast<char*>(out);
  while (n > 0) {
    const ssize_t got = ::pread(fd, p, std::min<uint64_t>(n, 1 << 30), static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0)
      fail("cannot read '" + path + "'" +
           (got < 0 ? std::string(": ") + std::strerror(errno) : ": it shrank while being read"));
    p += got;
    offset += static_cast<uint64_t>(got);
    n -= static_cast<uint64_t>(got);
  }
}

class Fd {
 public:
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() {
    if (fd_ >= 0) ::close(fd_);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_;
};

}  // namespace

Header parse_header(const std::string& prefix, uint64_t file_size, const std::string& label) {
  const Preamble p = preamble(prefix, file_size, label);
  if (prefix.size() < p.data_offset) fail(label + ": truncated .npy header");
  const std::string dict = prefix.substr(p.header_start, p.data_offset - p.header_start);
  std::string descr;
  Header header;
  HeaderParser(dict, label).parse(&descr, &header.fortran_order, &header.shape);
  header.dtype = dtype_from_descr(descr, label);
  header.data_offset = p.data_offset;
  try {
    header.data_bytes = detail::checked_nbytes(header.shape, c10::elementSize(header.dtype));
  } catch (const Error& e) {
    fail(label + ": " + e.what());
  }
  const uint64_t held = file_size - p.data_offset;
  if (held != header.data_bytes)
    fail(label + ": holds " + std::to_string(held) + " data bytes, " +
         describe(header.dtype, header.shape) + " needs " + std::to_string(header.data_bytes));
  return header;
}

at::Tensor parse(const std::string& bytes, const std::string& label) {
  const Header header = parse_header(bytes, bytes.size(), label);
  at::Tensor storage = storage_for(header);
  if (header.data_bytes > 0)
    std::memcpy(storage.data_ptr(), bytes.data() + header.data_offset, header.data_bytes);
  return finish(header, std::move(storage), label);
}

at::Tensor read(const std::string& path) {
  // Only a regular file, and nothing allocated beyond what its size holds: /dev/zero, a
  // FIFO or a header claiming 64 GiB is an error, never an endless read or a huge buffer.
  Fd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (fd.get() < 0) fail("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd.get(), &st) != 0 || !S_ISREG(st.st_mode))
    fail("cannot read '" + path + "': not a regular file");
  const uint64_t size = static_cast<uint64_t>(st.st_size);
  std::string prefix(std::min<uint64_t>(size, 12), '\0');
  read_exact(fd.get(), 0, prefix.data(), prefix.size(), path);
  prefix.resize(preamble(prefix, size, path).data_offset);  // <= 12 + kMaxHeaderBytes
  read_exact(fd.get(), 0, prefix.data(), prefix.size(), path);
  const Header header = parse_header(prefix, size, path);
  at::Tensor storage = storage_for(header);
  read_exact(fd.get(), header.data_offset, storage.data_ptr(), header.data_bytes, path);
  return finish(header, std::move(storage), path);
}

}  // namespace aotpack::npy

at::Tensor aotpack::load_npy(const std::string& path) { return npy::read(path); }
