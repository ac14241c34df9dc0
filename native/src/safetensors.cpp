#include "safetensors.h"

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <tuple>

#include "aotpack/archive_layout.h"
#include "dtype.h"
#include "manifest.h"
#include "util.h"

namespace aotpack::detail {
namespace {

using nlohmann::json;

uint64_t read_le64(const char* bytes) {
  uint64_t value = 0;
  for (int i = 7; i >= 0; --i) value = (value << 8) | static_cast<unsigned char>(bytes[i]);
  return value;
}

json parse_header(const char* file, uint64_t header_len) {
  json header = parse_strict_json(file + 8, header_len, AOTPACK_MAX_JSON_DEPTH, "header");
  if (!header.is_object()) fail("header is not a JSON object");
  return header;
}

std::vector<int64_t> parse_shape(const json& info, const std::string& name) {
  auto it = info.find("shape");
  if (it == info.end() || !it->is_array()) fail("tensor '" + name + "' has no shape list");
  std::vector<int64_t> shape;
  for (const json& d : *it) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      fail("tensor '" + name + "' has a bad shape entry");
    shape.push_back(d.get<int64_t>());
  }
  return shape;
}

SafeTensorView parse_tensor(const json& info, const std::string& name, const char* data,
                            uint64_t data_size) {
  if (!info.is_object()) fail("tensor '" + name + "' is not a JSON object");
  auto dtype = info.find("dtype");
  if (dtype == info.end() || !dtype->is_string()) fail("tensor '" + name + "' has no dtype");
  SafeTensorView view;
  view.dtype = dtype_from_safetensors(dtype->get<std::string>());
  view.shape = parse_shape(info, name);
  auto offsets = info.find("data_offsets");
  if (offsets == info.end() || !offsets->is_array() || offsets->size() != 2 ||
      !(*offsets)[0].is_number_unsigned() || !(*offsets)[1].is_number_unsigned())
    fail("tensor '" + name + "' has no valid data_offsets");
  const uint64_t begin = (*offsets)[0].get<uint64_t>(), end = (*offsets)[1].get<uint64_t>();
  if (begin > end) fail("tensor '" + name + "' data_offsets end before they begin");
  if (end > data_size) fail("tensor '" + name + "' data_offsets lie outside the file");
  view.nbytes = checked_nbytes(view.shape, c10::elementSize(view.dtype));
  if (end - begin != view.nbytes)
    fail("tensor '" + name + "' holds " + std::to_string(end - begin) + " bytes, " +
         describe(view.dtype, view.shape) + " needs " + std::to_string(view.nbytes));
  view.data = data + begin;
  return view;
}

// The data_offsets, sorted, must tile [0, data_size): no two tensors share a byte and no
// byte belongs to no tensor (huggingface/safetensors' own validation; aotpack's writer
// pads the header, never the data). Same rule and messages as aotpack/archive/file_checks.py.
void check_tiling(const std::map<std::string, SafeTensorView>& tensors, const char* data,
                  uint64_t data_size) {
  struct Span {
    uint64_t begin, end;
    const std::string* name;
  };
  std::vector<Span> spans;
  for (const auto& [name, view] : tensors) {
    const auto begin = static_cast<uint64_t>(view.data - data);
    spans.push_back({begin, begin + view.nbytes, &name});
  }
  std::sort(spans.begin(), spans.end(), [](const Span& a, const Span& b) {
    return std::tie(a.begin, a.end, *a.name) < std::tie(b.begin, b.end, *b.name);
  });
  uint64_t covered = 0;
  const Span* previous = nullptr;
  for (const Span& span : spans) {
    if (span.begin < covered)
      fail("tensors '" + *previous->name + "' and '" + *span.name + "' overlap: data_offsets [" +
           std::to_string(previous->begin) + ", " + std::to_string(previous->end) + "] and [" +
           std::to_string(span.begin) + ", " + std::to_string(span.end) + "]");
    if (span.begin > covered) break;
    covered = span.end;
    previous = &span;
  }
  if (covered != data_size) {
    uint64_t gap_end = data_size;
    for (const Span& span : spans)
      if (span.begin > covered) {
        gap_end = span.begin;
        break;
      }
    fail(std::to_string(gap_end - covered) + " bytes at data offset " + std::to_string(covered) +
         " belong to no tensor (data_offsets must cover the data back to back)");
  }
}

}  // namespace

std::map<std::string, SafeTensorView> parse_safetensors(const char* file, size_t size) {
  if (size < 8) fail("safetensors file is shorter than its 8-byte header length");
  const uint64_t header_len = read_le64(file);
  if (header_len > size - 8) fail("safetensors header length exceeds the file size");
  const json header = parse_header(file, header_len);
  const char* data = file + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::map<std::string, SafeTensorView> tensors;
  for (const auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    tensors.emplace(name, parse_tensor(info, name, data, data_size));
  }
  check_tiling(tensors, data, data_size);
  return tensors;
}

std::map<std::string, SafeTensorView> parse_safetensors(const std::string& file) {
  return parse_safetensors(file.data(), file.size());
}

std::shared_ptr<MappedFile> MappedFile::open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) fail("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    ::close(fd);
    fail("cannot stat '" + path + "'");
  }
  auto mapped = std::make_shared<MappedFile>();
  if (st.st_size > 0) {
    void* p = mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ | PROT_WRITE, MAP_PRIVATE,
                   fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      fail("cannot map '" + path + "': " + std::strerror(err));
    }
    mapped->data = static_cast<const char*>(p);
    mapped->size = static_cast<size_t>(st.st_size);
  }
  ::close(fd);
  return mapped;
}

MappedFile::~MappedFile() {
  if (data) munmap(const_cast<char*>(data), size);
}

}  // namespace aotpack::detail
