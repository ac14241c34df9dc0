#include "limits.h"

#include <cstdlib>
#include <string>

#include "aotpack/env_vars.h"
#include "util.h"

namespace aotpack::detail {
namespace {

// Decimal digits only, 1 to AOTPACK_LIMIT_VALUE_MAX: the rule of aotpack/archive/reader.py's
// parse_limit (strtoull alone would take " 5", "+5" and "-5").
void override_from(const char* name, uint64_t* value) {
  const char* raw = std::getenv(name);
  if (raw == nullptr || *raw == '\0') return;
  uint64_t parsed = 0;
  bool ok = true;
  for (const char* c = raw; *c != '\0' && ok; ++c) {
    const unsigned digit = static_cast<unsigned char>(*c) - '0';
    ok = digit <= 9 && parsed <= (AOTPACK_LIMIT_VALUE_MAX - digit) / 10;
    parsed = parsed * 10 + digit;
  }
  if (!ok || parsed == 0)
    fail(std::string(name) + " must be an integer from 1 to " + std::to_string(AOTPACK_LIMIT_VALUE_MAX) +
         ", got '" + raw + "'");
  *value = parsed;
}

}  // namespace

Limits Limits::from_env() {
  Limits limits;
  override_from(AOTPACK_ENV_MAX_ENTRIES, &limits.max_entries);
  override_from(AOTPACK_ENV_MAX_ENTRY_BYTES, &limits.max_entry_bytes);
  override_from(AOTPACK_ENV_MAX_TOTAL_BYTES, &limits.max_total_bytes);
  override_from(AOTPACK_ENV_MAX_MANIFEST_BYTES, &limits.max_manifest_bytes);
  return limits;
}

}  // namespace aotpack::detail
