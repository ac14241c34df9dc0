#include "dtype.h"

#include <utility>

#include "util.h"

namespace aotpack::detail {
namespace {

using c10::ScalarType;

// One table for both spellings, in the order docs/archive.md lists the dtypes.
struct DTypeNames {
  ScalarType type;
  const char* name;         // manifest spelling (torch's name without "torch.")
  const char* safetensors;  // safetensors header spelling
};

constexpr DTypeNames kDTypes[] = {
    {ScalarType::Float, "float32", "F32"}, {ScalarType::Double, "float64", "F64"},
    {ScalarType::Half, "float16", "F16"},  {ScalarType::BFloat16, "bfloat16", "BF16"},
    {ScalarType::Long, "int64", "I64"},    {ScalarType::Int, "int32", "I32"},
    {ScalarType::Short, "int16", "I16"},   {ScalarType::Char, "int8", "I8"},
    {ScalarType::Byte, "uint8", "U8"},     {ScalarType::Bool, "bool", "BOOL"},
};

std::string allowed(bool safetensors) {
  std::string out;
  for (const auto& d : kDTypes) {
    if (!out.empty()) out += ", ";
    out += safetensors ? d.safetensors : d.name;
  }
  return out;
}

}  // namespace

c10::ScalarType dtype_from_name(const std::string& name) {
  for (const auto& d : kDTypes)
    if (name == d.name) return d.type;
  fail("unknown dtype '" + name + "' (expected one of " + allowed(false) + ")");
}

c10::ScalarType dtype_from_safetensors(const std::string& code) {
  for (const auto& d : kDTypes)
    if (code == d.safetensors) return d.type;
  fail("unsupported safetensors dtype '" + code + "' (expected one of " + allowed(true) + ")");
}

bool is_supported_dtype_code(int32_t code) {
  for (const auto& d : kDTypes)
    if (static_cast<int32_t>(d.type) == code) return true;
  return false;
}

}  // namespace aotpack::detail

namespace aotpack {

std::string dtype_name(c10::ScalarType dtype) {
  for (const auto& d : detail::kDTypes)
    if (d.type == dtype) return d.name;
  return "dtype" + std::to_string(static_cast<int>(dtype));
}

std::string describe(c10::ScalarType dtype, const std::vector<int64_t>& shape) {
  return dtype_name(dtype) + detail::format_ints(shape);
}

}  // namespace aotpack
