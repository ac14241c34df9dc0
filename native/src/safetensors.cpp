#include "safetensors.h"

#include <nlohmann/json.hpp>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "dtype.h"
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
  try {
    json header = json::parse(file + 8, file + 8 + header_len);
    if (!header.is_object()) fail("header is not a JSON object");
    return header;
  } catch (const json::exception& e) {
    fail(std::string("header is not valid JSON: ") + e.what());
  }
}

std::vector<int64_t> parse_shape(const json& info, const std::string& name) {
  auto it = info.find("shape");
  if (it == info.end() || !it->is_array()) fail("tensor '" + name + "' has no shape list");
  std::vector<int64_t> shape;
  for (const json& d : *it) {
    if (!d.is_number_unsigned()) fail("tensor '" + name + "' has a bad shape entry");
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
  if (begin > end || end > data_size)
    fail("tensor '" + name + "' data_offsets lie outside the file");
  view.nbytes = checked_nbytes(view.shape, c10::elementSize(view.dtype));
  if (end - begin != view.nbytes)
    fail("tensor '" + name + "' holds " + std::to_string(end - begin) + " bytes, " +
         describe(view.dtype, view.shape) + " needs " + std::to_string(view.nbytes));
  view.data = data + begin;
  return view;
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
