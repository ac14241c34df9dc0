#include "extract.h"

#include <unistd.h>

#include <algorithm>
#include <unordered_set>
#include <vector>

#include "aotpack/runtime.h"  // AOTPACK_SIGNATURE_*
#include "archive.h"
#include "device.h"
#include "safetensors.h"
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

// Streams the current entry to `root/path` (nowhere when `root` is "") while hashing, as a
// file of permissions `mode`; returns the hex digest.
std::string stream_entry(ArchiveReader& reader, const EntryHeader& header,
                         const std::string& root, int mode, std::vector<char>& chunk) {
  const std::string full = root + "/" + header.path;
  const int fd = root.empty() ? -1 : create_new_file(root, header.path, mode);
  Sha256 hash;
  uint64_t done = 0;
  try {
    for (;;) {
      const size_t n = reader.read(chunk.data(), chunk.size());
      if (n == 0) break;
      done += n;
      if (done > header.size) fail("entry '" + header.path + "' holds more data than its header says");
      hash.update(chunk.data(), n);
      if (fd >= 0) write_all(fd, chunk.data(), n, full);
    }
    if (done != header.size) fail("entry '" + header.path + "' is truncated");
  } catch (...) {
    if (fd >= 0) ::close(fd);
    throw;
  }
  if (fd >= 0 && ::close(fd) != 0) fail("cannot close '" + full + "'");
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
  SigningKey key;
  if (!trusted_keys.empty()) {
    if (signature.empty())
      fail("the archive is not signed, but trusted keys are set (AOTPACK_TRUSTED_KEYS/--trusted-key)");
    key = verify_signature(manifest_text, signature, trusted_keys);
  }
  Manifest manifest = parse_manifest(manifest_text, limits.max_json_depth);
  check_limits(manifest, limits);
  manifest.signature_state = signature.empty() ? AOTPACK_SIGNATURE_NONE
                             : trusted_keys.empty() ? AOTPACK_SIGNATURE_UNCHECKED
                                                    : AOTPACK_SIGNATURE_VERIFIED;
  manifest.signed_by = key.path;
  manifest.signed_by_sha256 = key.sha256;
  return manifest;
}

VerifiedArchive::VerifiedArchive(const std::string& archive_path, const Limits& limits,
                                 const std::vector<std::string>& trusted_keys)
    : reader_(archive_path), limits_(limits) {
  EntryHeader header = expect_entry(reader_, kManifestPath, &seen_, limits_);
  text_ = reader_.read_small(header, limits_.max_manifest_bytes, kManifestPath);
  header = expect_entry(reader_, kManifestDigestPath, &seen_, limits_);
  digest_ = reader_.read_small(header, 65, kManifestDigestPath);
  have_next_ = next_file(reader_, &next_, &seen_, limits_);
  if (have_next_ && next_.path == kManifestSignaturePath) {
    signature_ = reader_.read_small(next_, 64, kManifestSignaturePath);
    have_next_ = next_file(reader_, &next_, &seen_, limits_);
  }
  manifest_ = check_manifest_entries(text_, digest_, signature_, trusted_keys, limits_);
  manifest_sha256_ = digest_.substr(0, digest_.size() - 1);  // checked: hex + '\n'
}

void VerifiedArchive::extract_to(const std::string& root) {
  if (extracted_) fail("internal error: an archive was extracted twice");
  extracted_ = true;
  std::unordered_set<std::string> written;
  std::vector<char> chunk(kChunk);
  // The manifest's backend passed check_compatibility before anything is extracted.
  const Device* device = root.empty() ? nullptr : &device_for_backend(manifest_.backend);
  EntryHeader& header = next_;
  for (; have_next_; have_next_ = next_file(reader_, &header, &seen_, limits_)) {
    if (is_manifest_entry(header.path))
      fail("entry '" + header.path + "' appears twice or out of place");
    auto it = manifest_.files.find(header.path);
    if (it == manifest_.files.end())
      fail("entry '" + header.path + "' is not listed in manifest.json 'files'");
    if (written.count(header.path)) fail("entry '" + header.path + "' appears twice");
    if (header.size != it->second.size)
      fail("entry '" + header.path + "' is " + std::to_string(header.size) +
           " bytes, manifest.json says " + std::to_string(it->second.size));
    const int mode = device && device->is_binary(header.path) ? 0755 : 0644;
    if (stream_entry(reader_, header, root, mode, chunk) != it->second.sha256)
      fail("sha256 mismatch for '" + header.path + "' (the archive is corrupt or was modified)");
    written.insert(header.path);
  }
  reader_.finish();
  report_missing(manifest_, written);
  if (root.empty()) return;
  for (const auto& [path, data] : {std::pair<const char*, const std::string*>{kManifestPath, &text_},
                                   {kManifestDigestPath, &digest_},
                                   {kManifestSignaturePath, &signature_}}) {
    if (path == kManifestSignaturePath && data->empty()) continue;
    const int fd = create_new_file(root, path, 0644);
    try {
      write_all(fd, data->data(), data->size(), root + "/" + path);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) fail("cannot write '" + root + "/" + path + "'");
  }
}

void check_file_contents(const Manifest& manifest, const std::string& root) {
  const Device& device = device_for_backend(manifest.backend);
  std::vector<std::string> objects, tensor_files;
  for (const auto& [path, record] : manifest.files) {
    if (device.is_binary(path) || path == manifest.model_library) objects.push_back(path);
    if (ends_with(path, ".safetensors")) tensor_files.push_back(path);
  }
  std::sort(objects.begin(), objects.end());
  std::sort(tensor_files.begin(), tensor_files.end());
  for (const std::string& path : objects) device.check_binary(root + "/" + path, path);
  for (const std::string& path : tensor_files) {
    const auto mapped = MappedFile::open(root + "/" + path);
    try {
      parse_safetensors(mapped->data, mapped->size);
    } catch (const Error& e) {
      fail(path + ": " + e.what());
    }
  }
}

}  // namespace aotpack::detail
