#include "limits.h"

#include <cerrno>
#include <cstdlib>
#include <string>

#include "util.h"

namespace aotpack::detail {
namespace {

void override_from(const char* name, uint64_t* value) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return;
  char* end = nullptr;
  errno = 0;
  const unsigned long long parsed = std::strtoull(raw, &end, 10);
  if (*end != '\0' || errno != 0 || parsed == 0 || raw[0] == '-')
    fail(std::string(name) + " must be a positive integer, got '" + raw + "'");
  *value = parsed;
}

}  // namespace

Limits Limits::from_env() {
  Limits limits;
  override_from("AOTPACK_MAX_ENTRIES", &limits.max_entries);
  override_from("AOTPACK_MAX_ENTRY_BYTES", &limits.max_entry_bytes);
  override_from("AOTPACK_MAX_TOTAL_BYTES", &limits.max_total_bytes);
  override_from("AOTPACK_MAX_MANIFEST_BYTES", &limits.max_manifest_bytes);
  return limits;
}

}  // namespace aotpack::detail
