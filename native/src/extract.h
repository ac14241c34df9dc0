// Reading an archive entry by entry with every check of docs/archive.md ("Reading rules"):
// manifest entries first, then each file streamed to disk in fixed chunks while hashed.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "archive.h"
#include "limits.h"
#include "manifest.h"

namespace aotpack::detail {

/// Checks the manifest entries of an archive: `digest` (manifest.sha256) is the hex sha256
/// of `manifest_text` plus '\n'; with `trusted_keys`, `signature` must be a valid
/// Ed25519 signature of it by one of them. Then parses the manifest and checks it against
/// `limits`. Throws aotpack::Error.
Manifest check_manifest_entries(const std::string& manifest_text, const std::string& digest,
                                const std::string& signature,
                                const std::vector<std::string>& trusted_keys,
                                const Limits& limits);

/// An archive being read for extraction. The constructor reads and checks its manifest
/// entries (check_manifest_entries; nothing is written before they pass); extract_to()
/// then streams every file, while hashing it, to a folder. Throws aotpack::Error.
class VerifiedArchive {
 public:
  VerifiedArchive(const std::string& archive_path, const Limits& limits,
                  const std::vector<std::string>& trusted_keys);
  VerifiedArchive(const VerifiedArchive&) = delete;
  VerifiedArchive& operator=(const VerifiedArchive&) = delete;

  const Manifest& manifest() const { return manifest_; }
  /// Hex sha256 of manifest.json, checked against manifest.sha256: it names every file's
  /// sha256 and size, so it identifies the archive's whole contents.
  const std::string& manifest_sha256() const { return manifest_sha256_; }

  /// Streams every file into `root` (an existing folder). A file's header size must equal
  /// the manifest's before a byte is written, its sha256 must match at the end; no file
  /// may be missing, unlisted or repeated. Then writes the manifest entries beside them
  /// (a reused cache entry is re-checked against them). `root` "": only read and check
  /// every byte, writing nothing (--check on a cache hit). Call once. Throws aotpack::Error;
  /// files already written stay (the caller removes the folder).
  void extract_to(const std::string& root);

 private:
  ArchiveReader reader_;
  Limits limits_;
  uint64_t seen_ = 0;      // entries read so far (limits.max_entries)
  EntryHeader next_;       // the first entry after the manifest entries
  bool have_next_ = false;
  std::string text_, digest_, signature_;
  Manifest manifest_;
  std::string manifest_sha256_;
  bool extracted_ = false;
};

/// The content checks of docs/archive.md rule 6 on the files under `root`, in the order
/// aotpack/archive/reader.py makes them: the backend's Device::check_binary on each of its
/// binaries (the CPU: every `.so`, an ELF check) and on model.library (whatever its name: it
/// is dlopened), then parse_safetensors on every `.safetensors`
/// (weights and self-test), each in path order. Throws aotpack::Error naming the file.
void check_file_contents(const Manifest& manifest, const std::string& root);

}  // namespace aotpack::detail
