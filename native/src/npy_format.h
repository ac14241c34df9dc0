// The .npy format's constants, shared by the runtime's reader (npy.cpp) and aotpack-run's
// writer (tools/npy.cpp). Only c10's ScalarType: the tools include it without ATen.
#pragma once

#include <c10/core/ScalarType.h>

#include <cstddef>

namespace aotpack::npy {

inline constexpr char kMagic[] = "\x93NUMPY";
inline constexpr size_t kMagicLen = 6;

/// A dtype .npy holds, and its descr code without the byte-order character.
struct Descr {
  c10::ScalarType dtype;
  const char* code;
};

/// Every dtype the runtime reads and writes as .npy (bfloat16 has no .npy form).
inline constexpr Descr kDescrs[] = {
    {c10::ScalarType::Float, "f4"}, {c10::ScalarType::Double, "f8"},
    {c10::ScalarType::Half, "f2"},  {c10::ScalarType::Long, "i8"},
    {c10::ScalarType::Int, "i4"},   {c10::ScalarType::Short, "i2"},
    {c10::ScalarType::Char, "i1"},  {c10::ScalarType::Byte, "u1"},
    {c10::ScalarType::Bool, "b1"},
};

}  // namespace aotpack::npy
