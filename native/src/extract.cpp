#include "extract.h"

#include <unistd.h>

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "archive.h"
#include "elf_check.h"
#include "sha256.h"
#include "signature.h"
#include "tempdir.h"
#include "util.h"

namespace aotpack::detail {
namespace {

constexpr size_t kChunk = 1 << 20;  // the only buffer an entry's data passes through

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::char_traits<char>::length(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// The next regular-file entry (directories are skipped); false at the end.
bool next_file(ArchiveReader& reader, EntryHeader* header, uint64_t* seen, const Limits& limits) {
  while (reader.next(header)) {
    if (++*seen > limits.max_entries)
      fail("the archive has more than " + std::to_string(limits.max_entries) +
           " entries (AOTPACK_MAX_ENTRIES)");
    if (header->regular) return true;
  }
  return false;
}

EntryHeader expect_entry(ArchiveReader& reader, const char* path, uint64_t* seen,
                         const Limits& limits) {
  EntryHeader header;
  if (!next_file(reader, &header, seen, limits) || header.path != path)
    fail(std::string("the archive's ") + (std::string(path) == kManifestPath ? "first" : "second") +
         " entry must be " + path + (header.path.empty() ? "" : ", found '" + header.path + "'"));
  return header;
}

// Streams the current entry to `root/path` while hashing; returns the hex digest.
std::string stream_entry(ArchiveReader& reader, const EntryHeader& header,
                         const std::string& root, std::vector<char>& chunk) {
  const std::string full = root + "/" + header.path;
  const int fd = create_new_file(root, header.path, ends_with(header.path, ".so") ? 0755 : 0644);
  Sha256 hash;
  uint64_t done = 0;
  try {
    for (;;) {
      const size_t n = reader.read(chunk.data(), chunk.size());
      if (n == 0) break;
      done += n;
      if (done > header.size) fail("entry '" + header.path + "' holds more data than its header says");
      hash.update(chunk.data(), n);
      write_all(fd, chunk.data(), n, full);
    }
    if (done != header.size) fail("entry '" + header.path + "' is truncated");
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("cannot close '" + full + "'");
  return hash.hex();
}

void report_missing(const Manifest& manifest, const std::unordered_set<std::string>& written) {
  std::vector<std::string> missing;
  for (const auto& [path, record] : manifest.files)
    if (!written.count(path)) missing.push_back(path);
  if (missing.empty()) return;
  std::sort(missing.begin(), missing.end());
  fail("file '" + missing.front() + "' listed in manifest.json is missing from the archive" +
       (missing.size() > 1 ? " (and " + std::to_string(missing.size() - 1) + " more)" : ""));
}

}  // namespace

Manifest check_manifest_entries(const std::string& manifest_text, const std::string& digest,
                                const std::string& signature,
                                const std::vector<std::string>& trusted_keys,
                                const Limits& limits) {
  if (digest != sha256_hex(manifest_text) + "\n")
    fail("manifest.json does not match manifest.sha256 (the manifest was modified or is corrupt)");
  if (!trusted_keys.empty()) {
    if (signature.empty())
      fail("the archive is not signed, but trusted keys are set (AOTPACK_TRUSTED_KEYS/--trusted-key)");
    verify_signature(manifest_text, signature, trusted_keys);
  }
  Manifest manifest = parse_manifest(manifest_text, limits.max_json_depth);
  check_limits(manifest, limits);
  return manifest;
}

VerifiedArchive extract_archive(const std::string& archive_path, const Limits& limits,
                                const std::vector<std::string>& trusted_keys,
                                const std::function<std::string(const Manifest&)>& destination,
                                const std::string& expected_sha256) {
  ArchiveReader reader(archive_path);
  uint64_t seen = 0;
  EntryHeader header = expect_entry(reader, kManifestPath, &seen, limits);
  const std::string text = reader.read_small(header, limits.max_manifest_bytes, kManifestPath);
  header = expect_entry(reader, kManifestDigestPath, &seen, limits);
  const std::string digest = reader.read_small(header, 65, kManifestDigestPath);

  VerifiedArchive out;
  bool have_entry = next_file(reader, &header, &seen, limits);
  if (have_entry && header.path == kManifestSignaturePath) {
    out.signature = reader.read_small(header, 64, kManifestSignaturePath);
    have_entry = next_file(reader, &header, &seen, limits);
  }
  out.manifest = check_manifest_entries(text, digest, out.signature, trusted_keys, limits);

  // Only now is anything written.
  const std::string root = destination(out.manifest);
  std::unordered_set<std::string> written;
  std::vector<char> chunk(kChunk);
  for (; have_entry; have_entry = next_file(reader, &header, &seen, limits)) {
    if (is_manifest_entry(header.path))
      fail("entry '" + header.path + "' appears twice or out of place");
    auto it = out.manifest.files.find(header.path);
    if (it == out.manifest.files.end())
      fail("entry '" + header.path + "' is not listed in manifest.json 'files'");
    if (written.count(header.path)) fail("entry '" + header.path + "' appears twice");
    if (header.size != it->second.size)
      fail("entry '" + header.path + "' is " + std::to_string(header.size) +
           " bytes, manifest.json says " + std::to_string(it->second.size));
    if (stream_entry(reader, header, root, chunk) != it->second.sha256)
      fail("sha256 mismatch for '" + header.path + "' (the archive is corrupt or was modified)");
    written.insert(header.path);
  }
  report_missing(out.manifest, written);
  out.archive_sha256 = reader.file_sha256();
  if (!expected_sha256.empty() && out.archive_sha256 != expected_sha256)
    fail("the archive changed while it was being read");
  // The manifest entries are kept beside the files (the cache re-checks them).
  for (const auto& [path, data] : {std::pair<const char*, const std::string*>{kManifestPath, &text},
                                   {kManifestDigestPath, &digest},
                                   {kManifestSignaturePath, &out.signature}}) {
    if (path == kManifestSignaturePath && data->empty()) continue;
    const int fd = create_new_file(root, path, 0644);
    try {
      write_all(fd, data->data(), data->size(), root + "/" + path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    ::close(fd);
  }
  return out;
}

void check_shared_objects(const Manifest& manifest, const std::string& root) {
  std::vector<std::string> objects;
  for (const auto& [path, record] : manifest.files)
    if (ends_with(path, ".so")) objects.push_back(path);
  std::sort(objects.begin(), objects.end());
  for (const std::string& path : objects) check_elf(root + "/" + path, path);
}

}  // namespace aotpack::detail
