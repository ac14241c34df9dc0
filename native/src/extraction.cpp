#include "extraction.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <sstream>
#include <unordered_set>

#include "archive.h"
#include "tempdir.h"
#include "util.h"

namespace aotpack::detail {
namespace {

constexpr char kMarker[] = ".aotpack-complete";
constexpr char kMarkerVersion[] = "aotpack-runtime-cache 2";
constexpr time_t kOrphanAgeSeconds = 600;

// ---- which cache entries this process has loaded (a second load gets a private copy) ----

std::mutex g_claims_mutex;
std::unordered_set<std::string>& claims() {
  static auto* set = new std::unordered_set<std::string>();
  return *set;
}

bool claim(const std::string& entry) {
  std::lock_guard<std::mutex> lock(g_claims_mutex);
  return claims().insert(entry).second;
}

void unclaim(const std::string& entry) {
  std::lock_guard<std::mutex> lock(g_claims_mutex);
  claims().erase(entry);
}

// ---- small file helpers ----

bool make_dirs(const std::string& path) {
  std::string partial;
  size_t start = 0;
  while (start < path.size()) {
    size_t end = path.find('/', start + 1);
    if (end == std::string::npos) end = path.size();
    partial = path.substr(0, end);
    if (mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) return false;
    start = end;
  }
  struct stat st{};
  return stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode) && access(path.c_str(), W_OK) == 0;
}

// A small regular file, at most `max_bytes`; false if it is not there or too big.
bool read_small_file(const std::string& path, uint64_t max_bytes, std::string* out) {
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) > max_bytes)
    return false;
  std::ifstream in(path, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  if (!in.good() && !in.eof()) return false;
  *out = content.str();
  return out->size() == static_cast<size_t>(st.st_size);
}

void write_small_file(const std::string& root, const std::string& name, const std::string& data) {
  const int fd = create_new_file(root, name, 0644);
  try {
    write_all(fd, data.data(), data.size(), root + "/" + name);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail("cannot write '" + root + "/" + name + "'");
}

std::string marker_text(const std::string& manifest_sha256) {
  return std::string(kMarkerVersion) + "\nmanifest " + manifest_sha256 + "\n";
}

void remove_tree(const std::string& path) noexcept {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

// ---- validating an existing entry ----

// Throws aotpack::Error unless `entry` holds exactly the files of `archive`'s (verified)
// manifest: its marker and manifest.json name that manifest, every listed file has the
// listed size, every .so passes check_elf. The files' sha256 were checked when the entry
// was extracted; the cache folder is private to the user (0700).
void check_entry(const std::string& entry, const VerifiedArchive& archive, const Limits& limits) {
  std::string text, marker;
  if (!read_small_file(entry + "/" + kMarker, 4096, &marker))
    fail("cache entry '" + entry + "' is incomplete");
  if (marker != marker_text(archive.manifest_sha256())) fail("cache entry '" + entry + "' is stale");
  if (!read_small_file(entry + "/" + kManifestPath, limits.max_manifest_bytes, &text) ||
      text != archive.manifest().text)
    fail("cache entry '" + entry + "' lacks its manifest");
  for (const auto& [path, record] : archive.manifest().files) {
    struct stat st{};
    const std::string full = entry + "/" + path;
    if (lstat(full.c_str(), &st) != 0 || !S_ISREG(st.st_mode) ||
        static_cast<uint64_t>(st.st_size) != record.size)
      fail("cache entry file '" + full + "' is missing or changed");
  }
  check_file_contents(archive.manifest(), entry);
}

bool entry_is_valid(const std::string& entry, const VerifiedArchive& archive, const Limits& limits) {
  struct stat st{};
  if (lstat(entry.c_str(), &st) != 0) return false;
  try {
    check_entry(entry, archive, limits);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// ---- temp folders under <cache>/tmp: "<name>/" plus "<name>.lock", locked while in use ----

// Removes temp folders whose owner is gone (its lock can be taken).
void clean_orphans(const std::string& tmp_root) {
  DIR* dir = opendir(tmp_root.c_str());
  if (!dir) return;
  std::vector<std::string> names;
  while (struct dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  std::unordered_set<std::string> locked;
  for (const std::string& name : names) {
    if (name.size() <= 5 || name.compare(name.size() - 5, 5, ".lock") != 0) continue;
    const std::string lock = tmp_root + "/" + name;
    const std::string folder = lock.substr(0, lock.size() - 5);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
      remove_tree(folder);
      ::unlink(lock.c_str());
    } else {
      locked.insert(name.substr(0, name.size() - 5));
    }
    ::close(fd);
  }
  const time_t now = std::time(nullptr);
  for (const std::string& name : names) {  // folders without a lock: a cleaner died midway
    const std::string full = tmp_root + "/" + name;
    struct stat st{};
    if (locked.count(name) || lstat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (access((full + ".lock").c_str(), F_OK) == 0) continue;
    if (now - st.st_mtime > kOrphanAgeSeconds) remove_tree(full);
  }
}

}  // namespace

// ---- Extraction ----

std::string Extraction::cache_root() {
  const char* off = std::getenv("AOTPACK_RUNTIME_CACHE");
  if (off && std::string(off) == "0") return "";
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  std::string base;
  if (xdg && xdg[0] == '/') {
    base = xdg;
  } else {
    const char* home = std::getenv("HOME");
    if (!home || home[0] != '/') return "";
    base = std::string(home) + "/.cache";
  }
  return base + "/aotpack/runtime";
}

namespace {

// A new locked private folder under `tmp_root` (the cache) or, when `tmp_root` is empty,
// $TMPDIR/aotpack-XXXXXX without a lock.
struct PrivateFolder {
  std::string path, lock_path;
  int lock_fd = -1;
};

PrivateFolder make_private_folder(const std::string& tmp_root) {
  PrivateFolder folder;
  if (tmp_root.empty()) {
    const char* base = std::getenv("TMPDIR");
    std::string templ = std::string(base && *base ? base : "/tmp") + "/aotpack-XXXXXX";
    if (mkdtemp(templ.data()) == nullptr)
      fail("cannot create a temp folder like '" + templ + "': " + std::strerror(errno));
    folder.path = templ;
    return folder;
  }
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string templ = tmp_root + "/x-XXXXXX.lock";
    const int fd = mkstemps(templ.data(), 5);
    if (fd < 0) fail("cannot create a lock file in '" + tmp_root + "': " + std::strerror(errno));
    struct stat held{}, named{};
    // A cleaner may have taken the fresh lock and removed the file before we locked it.
    if (flock(fd, LOCK_EX) != 0 || fstat(fd, &held) != 0 || stat(templ.c_str(), &named) != 0 ||
        held.st_ino != named.st_ino) {
      ::close(fd);
      continue;
    }
    const std::string path = templ.substr(0, templ.size() - 5);
    if (mkdir(path.c_str(), 0700) != 0) {
      ::unlink(templ.c_str());
      ::close(fd);
      continue;
    }
    folder.path = path;
    folder.lock_path = templ;
    folder.lock_fd = fd;
    return folder;
  }
  fail("cannot create a private folder under '" + tmp_root + "'");
}

}  // namespace

Extraction Extraction::open(const std::string& archive_path, const Limits& limits,
                            const std::vector<std::string>& trusted_keys,
                            const std::function<void(const Manifest&)>& check,
                            Manifest* manifest) {
  // Only the manifest entries are read unless the files must be extracted: the entry is
  // named by the manifest's sha256, which pins every file's sha256 and size.
  VerifiedArchive archive(archive_path, limits, trusted_keys);
  check(archive.manifest());
  *manifest = archive.manifest();
  std::string root = cache_root();
  if (!root.empty() && !make_dirs(root + "/tmp")) root.clear();  // read-only home: no cache
  const std::string tmp_root = root.empty() ? "" : root + "/tmp";
  if (!root.empty()) clean_orphans(tmp_root);
  const std::string entry = root.empty() ? "" : root + "/" + archive.manifest_sha256();
  const bool claimed = !entry.empty() && claim(entry);

  Extraction shared;
  if (claimed) {
    shared.path_ = entry;
    shared.shared_ = true;  // from here on, destroying `shared` releases the claim
    if (entry_is_valid(entry, archive, limits)) return shared;
  }
  Extraction fresh;
  PrivateFolder folder = make_private_folder(tmp_root);
  fresh.path_ = folder.path;
  fresh.lock_path_ = folder.lock_path;
  fresh.lock_fd_ = folder.lock_fd;
  archive.extract_to(fresh.path_);
  check_file_contents(archive.manifest(), fresh.path_);
  if (!claimed) return fresh;  // no cache, or this process already uses the entry
  write_small_file(fresh.path_, kMarker, marker_text(archive.manifest_sha256()));
  for (int attempt = 0; attempt < 2; ++attempt) {
    if (rename(fresh.path_.c_str(), entry.c_str()) == 0) {
      fresh.path_.clear();  // moved: releasing `fresh` now only drops its lock
      return shared;
    }
    if (errno != EEXIST && errno != ENOTEMPTY) break;
    // another process published it meanwhile
    if (entry_is_valid(entry, archive, limits)) return shared;
    PrivateFolder aside = make_private_folder(tmp_root);  // a stale entry: move it out of the way
    const bool moved = rename(entry.c_str(), aside.path.c_str()) == 0;
    remove_tree(aside.path);
    ::unlink(aside.lock_path.c_str());
    ::close(aside.lock_fd);
    if (!moved) break;
  }
  return fresh;  // could not publish: use the verified folder privately
}

Extraction::Extraction(Extraction&& other) noexcept
    : path_(std::move(other.path_)),
      lock_path_(std::move(other.lock_path_)),
      lock_fd_(other.lock_fd_),
      shared_(other.shared_) {
  other.path_.clear();
  other.lock_path_.clear();
  other.lock_fd_ = -1;
  other.shared_ = false;
}

Extraction& Extraction::operator=(Extraction&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    lock_path_ = std::move(other.lock_path_);
    lock_fd_ = other.lock_fd_;
    shared_ = other.shared_;
    other.path_.clear();
    other.lock_path_.clear();
    other.lock_fd_ = -1;
    other.shared_ = false;
  }
  return *this;
}

Extraction::~Extraction() { release(); }

void Extraction::release() noexcept {
  if (shared_) {
    unclaim(path_);
  } else if (!path_.empty()) {
    remove_tree(path_);
  }
  if (!lock_path_.empty()) ::unlink(lock_path_.c_str());
  if (lock_fd_ >= 0) ::close(lock_fd_);
  path_.clear();
  lock_path_.clear();
  lock_fd_ = -1;
  shared_ = false;
}

}  // namespace aotpack::detail
