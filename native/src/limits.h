// Limits on what reading an archive may cost (docs/archive.md, "Reading rules" 5). The
// defaults are declared once, in aotpack/archive/layout.py (archive_layout.h is generated from it);
// aotpack/archive/reader.py reads the same variables with the same rule.
#pragma once

#include <cstdint>

#include "aotpack/archive_layout.h"

namespace aotpack::detail {

struct Limits {
  uint64_t max_entries = AOTPACK_DEFAULT_MAX_ENTRIES;                // AOTPACK_MAX_ENTRIES
  uint64_t max_entry_bytes = AOTPACK_DEFAULT_MAX_ENTRY_BYTES;        // AOTPACK_MAX_ENTRY_BYTES
  uint64_t max_total_bytes = AOTPACK_DEFAULT_MAX_TOTAL_BYTES;        // AOTPACK_MAX_TOTAL_BYTES
  uint64_t max_manifest_bytes = AOTPACK_DEFAULT_MAX_MANIFEST_BYTES;  // AOTPACK_MAX_MANIFEST_BYTES
  uint64_t max_json_depth = AOTPACK_MAX_JSON_DEPTH;                  // fixed: manifest nesting depth

  /// Defaults overridden by the environment variables above (bytes or entries; an empty
  /// variable is unset). Throws aotpack::Error naming a variable whose value is not an
  /// integer from 1 to AOTPACK_LIMIT_VALUE_MAX written in decimal digits only.
  static Limits from_env();
};

}  // namespace aotpack::detail
