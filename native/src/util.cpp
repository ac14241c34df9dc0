#include "util.h"

#include <limits>

namespace aotpack::detail {

void fail(const std::string& message) { throw Error(message); }

std::string format_ints(const std::vector<int64_t>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(values[i]);
  }
  return out + "]";
}

uint64_t checked_nbytes(const std::vector<int64_t>& shape, uint64_t itemsize) {
  const uint64_t limit = std::numeric_limits<int64_t>::max();
  uint64_t total = itemsize;
  for (int64_t size : shape) {
    if (size < 0) fail("negative size in shape " + format_ints(shape));
    if (size != 0 && total > limit / static_cast<uint64_t>(size))
      fail("shape " + format_ints(shape) + " is too large");
    total *= static_cast<uint64_t>(size);
  }
  return total;
}

}  // namespace aotpack::detail
