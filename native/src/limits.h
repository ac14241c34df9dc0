// Limits on what reading an archive may cost (docs/archive.md, "Limits"). The same names
// and defaults are in aotpack/limits.py.
#pragma once

#include <cstdint>

namespace aotpack::detail {

struct Limits {
  uint64_t max_entries = 100000;               // AOTPACK_MAX_ENTRIES
  uint64_t max_entry_bytes = 64ull << 30;      // AOTPACK_MAX_ENTRY_BYTES (64 GiB)
  uint64_t max_total_bytes = 64ull << 30;      // AOTPACK_MAX_TOTAL_BYTES (64 GiB)
  uint64_t max_manifest_bytes = 64ull << 20;   // AOTPACK_MAX_MANIFEST_BYTES (64 MiB)
  uint64_t max_json_depth = 64;                // fixed: manifest nesting depth

  /// Defaults overridden by the environment variables above (positive integers, bytes).
  /// Throws aotpack::Error naming a variable whose value is not a positive integer.
  static Limits from_env();
};

}  // namespace aotpack::detail
