// aotpack_app ARCHIVE INPUT.npy...: load an .aotpack archive with the C++ API, run it once
// on .npy inputs (one per model input, in manifest order) and print each output.
//
// The .npy reader covers what numpy.save writes for the archive dtypes: format 1.0/2.0,
// little-endian, C order. float32 files feed bfloat16 inputs (.npy has no bfloat16).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <aotpack/runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

namespace {

c10::ScalarType npy_dtype(const std::string& descr, const std::string& path) {
  static const std::map<std::string, c10::ScalarType> kTypes = {
      {"<f4", c10::kFloat}, {"<f8", c10::kDouble}, {"<f2", c10::kHalf},  {"<i8", c10::kLong},
      {"<i4", c10::kInt},   {"<i2", c10::kShort},  {"|i1", c10::kChar},  {"|u1", c10::kByte},
      {"|b1", c10::kBool}};
  auto it = kTypes.find(descr);
  if (it == kTypes.end()) throw aotpack::Error(path + ": unsupported .npy dtype '" + descr + "'");
  return it->second;
}

at::Tensor read_npy(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw aotpack::Error(path + ": cannot open");
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.size() < 10 || bytes.compare(0, 6, "\x93NUMPY") != 0)
    throw aotpack::Error(path + ": not a .npy file");
  const int major = static_cast<unsigned char>(bytes[6]);
  const size_t length_bytes = major == 1 ? 2 : 4, start = 8 + length_bytes;
  size_t header_len = 0;
  for (size_t i = 0; i < length_bytes; ++i)
    header_len |= static_cast<size_t>(static_cast<unsigned char>(bytes[8 + i])) << (8 * i);
  if (bytes.size() < start + header_len) throw aotpack::Error(path + ": truncated header");
  const std::string header = bytes.substr(start, header_len);
  std::smatch descr, order, shape;
  if (!std::regex_search(header, descr, std::regex("'descr':\\s*'([^']+)'")) ||
      !std::regex_search(header, order, std::regex("'fortran_order':\\s*(True|False)")) ||
      !std::regex_search(header, shape, std::regex("'shape':\\s*\\(([^)]*)\\)")))
    throw aotpack::Error(path + ": unreadable .npy header");
  if (order[1] == "True") throw aotpack::Error(path + ": Fortran order is not supported");
  std::vector<int64_t> sizes;
  std::stringstream dims(shape[1].str());
  for (std::string dim; std::getline(dims, dim, ',');)
    if (dim.find_first_not_of(" ") != std::string::npos) sizes.push_back(std::stoll(dim));
  const c10::ScalarType dtype = npy_dtype(descr[1], path);
  at::Tensor tensor = at::empty(sizes, at::TensorOptions().dtype(dtype));
  const size_t nbytes = static_cast<size_t>(tensor.numel()) * tensor.element_size();
  if (bytes.size() - start - header_len != nbytes)
    throw aotpack::Error(path + ": data size does not match the header");
  if (nbytes > 0) std::memcpy(tensor.data_ptr(), bytes.data() + start + header_len, nbytes);
  return tensor;
}

void print_output(const aotpack::TensorSpec& spec, const at::Tensor& output) {
  constexpr int64_t kShown = 8;
  const at::Tensor values = output.reshape({-1}).to(c10::kDouble);
  std::printf("%s: %s =", spec.name.c_str(), aotpack::describe(output.scalar_type(),
                                                                 output.sizes().vec()).c_str());
  const int64_t shown = std::min(kShown, values.numel());
  for (int64_t i = 0; i < shown; ++i) std::printf(" %.6g", values.data_ptr<double>()[i]);
  if (values.numel() > kShown) std::printf(" ... (%lld values)", (long long)values.numel());
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s ARCHIVE INPUT.npy...\n", argv[0]);
    return 2;
  }
  try {
    aotpack::Model model = aotpack::Model::load(argv[1]);
    std::printf("loaded %s %s\n", model.name().c_str(), model.version().c_str());
    if (static_cast<size_t>(argc - 2) != model.inputs().size())
      throw aotpack::Error("the model takes " + std::to_string(model.inputs().size()) +
                           " input(s), got " + std::to_string(argc - 2) + " .npy file(s)");
    std::vector<at::Tensor> inputs;
    for (size_t i = 0; i < model.inputs().size(); ++i) {
      at::Tensor x = read_npy(argv[2 + i]);
      if (model.inputs()[i].dtype == c10::kBFloat16 && x.scalar_type() == c10::kFloat)
        x = x.to(c10::kBFloat16);
      inputs.push_back(x);
    }
    const std::vector<at::Tensor> outputs = model.run(inputs);
    for (size_t i = 0; i < outputs.size(); ++i) print_output(model.outputs()[i], outputs[i]);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "aotpack_app: error: %s\n", e.what());
    return 1;
  }
}
