// Reading an archive entry by entry with every check of docs/archive.md ("Reading rules"):
// manifest entries first, then each file streamed to disk in fixed chunks while hashed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "limits.h"
#include "manifest.h"

namespace aotpack::detail {

struct VerifiedArchive {
  Manifest manifest;
  std::string signature;       // manifest.sig (64 bytes), empty when unsigned
  std::string archive_sha256;  // of the archive file as read
};

/// Checks the manifest entries of an archive: `digest` (manifest.sha256) is the hex sha256
/// of `manifest_text` plus '\n'; with `trusted_keys`, `signature` must be a valid
/// Ed25519 signature of it by one of them. Then parses the manifest and checks it against
/// `limits`. Throws aotpack::Error.
Manifest check_manifest_entries(const std::string& manifest_text, const std::string& digest,
                                const std::string& signature,
                                const std::vector<std::string>& trusted_keys,
                                const Limits& limits);

/// Reads `archive_path`: the manifest entries (check_manifest_entries: nothing is written
/// before they pass), then `destination(manifest)` is called once for the folder to write
/// to (it may throw to refuse the manifest), and
/// every file is streamed there while hashed; its header size must equal the manifest's
/// before a byte is written, its sha256 must match at the end, no file may be missing,
/// unlisted or repeated. When `expected_sha256` is not empty the archive file must hash to
/// it (it did not change while read). Throws aotpack::Error; files already written stay
/// (the caller removes the folder).
VerifiedArchive extract_archive(const std::string& archive_path, const Limits& limits,
                                const std::vector<std::string>& trusted_keys,
                                const std::function<std::string(const Manifest&)>& destination,
                                const std::string& expected_sha256 = "");

/// Checks every listed `.so` file under `root` with check_elf. Throws aotpack::Error.
void check_shared_objects(const Manifest& manifest, const std::string& root);

}  // namespace aotpack::detail
