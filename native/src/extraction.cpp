#include "extraction.h"

#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <map>
#include <set>
#include <thread>
#include <unordered_set>

#include "aotpack/env_vars.h"
#include "archive.h"
#include "sha256.h"
#include "tempdir.h"
#include "util.h"

namespace aotpack::detail {

// One per cache entry this process uses: loads of one archive share its extraction.
struct CacheEntryState {
  std::mutex proving;   // held by the load that proves or extracts the entry
  bool proven = false;  // guarded by `proving`: the entry's files were hashed (or extracted) here
  int lock_fd = -1;     // guarded by `proving`: a shared flock on <entry>/.aotpack-lock
  int refs = 0;         // guarded by g_states_mutex
};

namespace {

constexpr char kMarker[] = ".aotpack-complete";
constexpr char kMarkerVersion[] = "aotpack-runtime-cache 3";
constexpr char kEntryLock[] = ".aotpack-lock";  // shared-locked while a process uses the entry
constexpr char kPrivatePrefix[] = "aotpack-";    // $TMPDIR/aotpack-XXXXXX (+ .lock)
constexpr time_t kOrphanAgeSeconds = 600;
constexpr uint64_t kDefaultCapMiB = AOTPACK_ENV_RUNTIME_CACHE_MB_DEFAULT;
constexpr size_t kChunk = 1 << 20;

// ---- the entries this process uses ----

std::mutex g_states_mutex;
std::map<std::string, std::shared_ptr<CacheEntryState>>& states() {
  static auto* map = new std::map<std::string, std::shared_ptr<CacheEntryState>>();
  return *map;
}

std::shared_ptr<CacheEntryState> acquire_state(const std::string& entry) {
  std::lock_guard<std::mutex> lock(g_states_mutex);
  auto& state = states()[entry];
  if (!state) state = std::make_shared<CacheEntryState>();
  ++state->refs;
  return state;
}

void drop_state(const std::string& entry, const std::shared_ptr<CacheEntryState>& state) noexcept {
  std::lock_guard<std::mutex> lock(g_states_mutex);
  if (--state->refs > 0) return;
  if (state->lock_fd >= 0) ::close(state->lock_fd);  // no load holds `proving` now
  state->lock_fd = -1;
  states().erase(entry);
}

// ---- small file helpers ----

void warn(const std::string& message) { std::fprintf(stderr, "aotpack: warning: %s\n", message.c_str()); }

void remove_tree(const std::string& path) noexcept {
  std::error_code ignored;
  std::filesystem::remove_all(path, ignored);
}

bool mkdirs(const std::string& path) {
  for (size_t end = path.find('/', 1);; end = path.find('/', end + 1)) {
    const std::string partial = path.substr(0, end);
    if (mkdir(partial.c_str(), 0700) != 0 && errno != EEXIST) return false;
    if (end == std::string::npos) return true;
  }
}

// "" when `path` is a folder owned by this user that no one else can write (a too-open
// one is tightened to 0700), created (0700) when missing; else why not. `read_only`: it
// is missing and cannot be created (a read-only home).
std::string private_folder_problem(const std::string& path, bool* read_only) {
  struct stat st{};
  if (lstat(path.c_str(), &st) != 0 && errno == ENOENT && mkdir(path.c_str(), 0700) != 0) {
    *read_only = errno == EACCES || errno == EROFS || errno == EPERM;
    return "cannot create '" + path + "': " + std::strerror(errno);
  }
  if (lstat(path.c_str(), &st) != 0) return "cannot use '" + path + "': " + std::strerror(errno);
  if (S_ISLNK(st.st_mode)) return "'" + path + "' is a symbolic link";
  if (!S_ISDIR(st.st_mode)) return "'" + path + "' is not a folder";
  if (st.st_uid != geteuid())
    return "'" + path + "' belongs to uid " + std::to_string(st.st_uid) + ", not to this user";
  if ((st.st_mode & 077) != 0 && chmod(path.c_str(), 0700) != 0)
    return "cannot make '" + path + "' private (chmod 0700): " + std::strerror(errno);
  return "";
}

// Opens `path` (no symlink followed) and checks it is a regular file of `size` bytes owned
// by this user that no one else can write; -1 and `why` otherwise.
int open_owned_file(const std::string& path, uint64_t size, std::string* why) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  struct stat st{};
  if (fd < 0 || fstat(fd, &st) != 0) {
    *why = "'" + path + "' is missing or a symbolic link";
  } else if (!S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022) != 0) {
    *why = "'" + path + "' is not a regular file private to this user";
  } else if (static_cast<uint64_t>(st.st_size) != size) {
    *why = "'" + path + "' has changed size";
  } else {
    return fd;
  }
  if (fd >= 0) ::close(fd);
  return -1;
}

// `populate`: map every page readable now, in one call (the hash reads them all next);
// MAP_POPULATE would copy them, the mapping being private and writable.
std::shared_ptr<MappedFile> map_fd(int fd, uint64_t size, const std::string& path, bool populate) {
  auto mapped = std::make_shared<MappedFile>();
  if (size == 0) return mapped;
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
#ifdef MADV_POPULATE_READ
  if (p != MAP_FAILED && populate) madvise(p, size, MADV_POPULATE_READ);  // best effort
#endif
  if (p == MAP_FAILED) fail("cannot map '" + path + "': " + std::strerror(errno));
  mapped->data = static_cast<const char*>(p);
  mapped->size = size;
  return mapped;
}

// weights.safetensors under `root`, mapped copy-on-write; null when the archive has none.
std::shared_ptr<MappedFile> map_weights(const std::string& root, const Manifest& manifest) {
  auto it = manifest.files.find(kWeightsPath);
  if (it == manifest.files.end()) return nullptr;
  const std::string path = root + "/" + kWeightsPath;
  std::string why;
  const int fd = open_owned_file(path, it->second.size, &why);
  if (fd < 0) fail("cannot map the weights: " + why);
  try {
    auto mapped = map_fd(fd, it->second.size, path, false);
    ::close(fd);
    return mapped;
  } catch (...) {
    ::close(fd);
    throw;
  }
}

std::string marker_text(const std::string& manifest_sha256, uint64_t bytes) {
  return std::string(kMarkerVersion) + "\nmanifest " + manifest_sha256 + "\nbytes " +
         std::to_string(bytes) + "\n";
}

uint64_t entry_bytes(const VerifiedArchive& archive) {
  uint64_t total = archive.manifest().text.size();
  for (const auto& [path, record] : archive.manifest().files) total += record.size;
  return total;
}

// A small regular file's content; "" when it is missing, a link or over `max_bytes`.
std::string read_small(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return "";
  std::string data(max_bytes + 1, '\0');
  size_t done = 0;
  for (ssize_t n; done < data.size() && (n = ::read(fd, &data[done], data.size() - done)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  return done > max_bytes ? "" : data.substr(0, done);
}

// ---- proving an entry ----

struct HashJob {
  std::string path;  // relative
  const FileRecord* record;
};

// Hashes one cached file (through the mapping kept for the model, for the weights);
// "" when it matches the manifest, else why not.
std::string prove_file(const std::string& entry, const HashJob& job,
                       std::shared_ptr<MappedFile>* weights) {
  const std::string full = entry + "/" + job.path;
  std::string why;
  const int fd = open_owned_file(full, job.record->size, &why);
  if (fd < 0) return why;
  Sha256 hash;
  try {
    // Hashed through a mapping, not a heap buffer: a 1 MiB buffer per hashing thread made
    // glibc keep that much in each of its arenas (RSS crept up over threaded load cycles).
    std::shared_ptr<MappedFile> mapped = map_fd(fd, job.record->size, full, job.path == kWeightsPath);
    for (size_t at = 0; at < mapped->size; at += kChunk)
      hash.update(mapped->data + at, std::min(kChunk, mapped->size - at));
    if (job.path == kWeightsPath) *weights = std::move(mapped);
    ::close(fd);
  } catch (const std::exception& e) {
    ::close(fd);
    return e.what();
  }
  return hash.hex() == job.record->sha256 ? "" : "sha256 mismatch for '" + full + "'";
}

// Hashes every listed file on a few threads, biggest first; "" when all match.
std::string prove_files(const std::string& entry, const Manifest& manifest,
                        std::shared_ptr<MappedFile>* weights) {
  std::vector<HashJob> jobs;
  uint64_t total = 0;
  for (const auto& [path, record] : manifest.files) {
    jobs.push_back(HashJob{path, &record});
    total += record.size;
  }
  std::sort(jobs.begin(), jobs.end(),
            [](const HashJob& a, const HashJob& b) { return a.record->size > b.record->size; });
  // Threads pay off from a few MiB on (a thread start costs ~50 us, a MiB of sha256 ~0.6 ms).
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const size_t threads = total < (4u << 20) ? 1 : std::min<size_t>({4, cores, jobs.size()});
  std::atomic<size_t> next{0};
  std::vector<std::string> problems(threads);
  auto work = [&](size_t t) {
    for (size_t i; problems[t].empty() && (i = next++) < jobs.size();)
      problems[t] = prove_file(entry, jobs[i], weights);
  };
  std::vector<std::thread> pool;
  for (size_t t = 1; t < threads; ++t) pool.emplace_back(work, t);
  work(0);
  for (std::thread& thread : pool) thread.join();
  for (const std::string& problem : problems)
    if (!problem.empty()) return problem;
  return "";
}

// The folders inside `entry` that hold its files: private to this user, not links.
std::string check_inner_folders(const std::string& entry, const Manifest& manifest) {
  std::set<std::string> folders;
  for (const auto& [path, record] : manifest.files)
    for (size_t slash = path.find('/'); slash != std::string::npos; slash = path.find('/', slash + 1))
      folders.insert(path.substr(0, slash));
  for (const std::string& folder : folders) {
    struct stat st{};
    const std::string full = entry + "/" + folder;
    if (lstat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
        (st.st_mode & 022) != 0)
      return "'" + full + "' is not a folder private to this user";
  }
  return "";
}

struct Proof {
  bool exists = false;   // something is at the entry's path
  std::string problem;   // "" = proven
  bool hostile = false;  // contents or ownership wrong (not merely stale or incomplete)
  int lock_fd = -1;      // proven: the shared lock on the entry
  std::shared_ptr<MappedFile> weights;
};

// Opens and shared-locks <entry>/.aotpack-lock; -1 if it is missing or was removed by an
// evictor while we waited.
int lock_entry(const std::string& entry) {
  const std::string path = entry + "/" + kEntryLock;
  const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) return -1;
  struct stat held{}, named{};
  if (flock(fd, LOCK_SH) != 0 || fstat(fd, &held) != 0 || lstat(path.c_str(), &named) != 0 ||
      held.st_ino != named.st_ino || held.st_dev != named.st_dev) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Everything about `entry` a load relies on, before any of it is used: its folder and
// every folder and file in it private to this user, its marker and manifest those of
// `archive`, every file's sha256 the manifest's (the weights hashed through the mapping
// the model then uses), every binary passing the device's check_binary.
Proof prove_entry(const std::string& entry, const VerifiedArchive& archive) {
  Proof proof;
  struct stat st{};
  proof.problem = "missing";
  if (lstat(entry.c_str(), &st) != 0) return proof;
  proof.exists = true;
  proof.hostile = true;
  if (S_ISLNK(st.st_mode) || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    proof.problem = "'" + entry + "' is not a folder private to this user";
    return proof;
  }
  proof.hostile = false;
  const std::string marker = read_small(entry + "/" + kMarker, 4096);
  if (marker != marker_text(archive.manifest_sha256(), entry_bytes(archive))) {
    proof.problem = "stale or incomplete";
    return proof;
  }
  if (read_small(entry + "/" + kManifestPath, archive.manifest().text.size()) != archive.manifest().text) {
    proof.problem = "its manifest differs";
    return proof;
  }
  proof.lock_fd = lock_entry(entry);
  if (proof.lock_fd < 0) {
    proof.problem = "its lock file is missing";
    return proof;
  }
  proof.hostile = true;
  proof.problem = check_inner_folders(entry, archive.manifest());
  if (proof.problem.empty()) proof.problem = prove_files(entry, archive.manifest(), &proof.weights);
  if (proof.problem.empty()) {
    try {
      check_file_contents(archive.manifest(), entry);
    } catch (const std::exception& e) {
      proof.problem = e.what();
    }
  }
  if (!proof.problem.empty()) {
    ::close(proof.lock_fd);
    proof.lock_fd = -1;
    proof.weights.reset();
  }
  return proof;
}

// ---- private folders: "<dir>/<prefix>XXXXXX/" plus "<...>.lock", flock-held while in use ----

struct PrivateFolder {
  std::string path, lock_path;
  int lock_fd = -1;
};

PrivateFolder make_private_folder(const std::string& dir, const std::string& prefix) {
  for (int attempt = 0; attempt < 100; ++attempt) {
    std::string templ = dir + "/" + prefix + "XXXXXX.lock";
    const int fd = mkstemps(templ.data(), 5);
    if (fd < 0) fail("cannot create a lock file in '" + dir + "': " + std::strerror(errno));
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
    return PrivateFolder{path, templ, fd};
  }
  fail("cannot create a private folder under '" + dir + "'");
}

void discard(PrivateFolder& folder) noexcept {
  remove_tree(folder.path);
  ::unlink(folder.lock_path.c_str());
  ::close(folder.lock_fd);
}

// Moves `entry` aside into `tmp_root` and removes it; false if it could not be moved.
bool remove_entry(const std::string& entry, const std::string& tmp_root) noexcept {
  try {
    PrivateFolder aside = make_private_folder(tmp_root, "x-");
    const bool moved = rename(entry.c_str(), aside.path.c_str()) == 0;
    discard(aside);
    return moved;
  } catch (const std::exception&) {
    return false;
  }
}

std::vector<std::string> folder_names(const std::string& path) {
  std::vector<std::string> names;
  DIR* dir = opendir(path.c_str());
  if (!dir) return names;
  while (struct dirent* d = readdir(dir)) {
    const std::string name = d->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

// Removes this user's private folders under `dir` named `prefix`... whose lock is free
// (their process is gone, even by SIGKILL); returns the names still locked. `exact`: only
// `prefix`XXXXXX (a folder shared with other programs, $TMPDIR).
std::unordered_set<std::string> clean_locked_orphans(const std::string& dir, const std::string& prefix,
                                                     const std::vector<std::string>& names, bool exact) {
  std::unordered_set<std::string> locked;
  const size_t length = prefix.size() + 6 + 5;  // XXXXXX.lock
  for (const std::string& name : names) {
    if ((exact ? name.size() != length : name.size() < length) || name.compare(0, prefix.size(), prefix) != 0 ||
        name.compare(name.size() - 5, 5, ".lock") != 0)
      continue;
    const std::string lock = dir + "/" + name;
    const std::string folder = lock.substr(0, lock.size() - 5);
    const int fd = ::open(lock.c_str(), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
    struct stat st{}, folder_st{};
    if (fd < 0) continue;
    const bool ours = fstat(fd, &st) == 0 && st.st_uid == geteuid() &&
                      (lstat(folder.c_str(), &folder_st) != 0 ||
                       (S_ISDIR(folder_st.st_mode) && folder_st.st_uid == geteuid()));
    if (ours && flock(fd, LOCK_EX | LOCK_NB) == 0) {
      remove_tree(folder);
      ::unlink(lock.c_str());
    } else {
      locked.insert(name.substr(0, name.size() - 5));
    }
    ::close(fd);
  }
  return locked;
}

// The cache's temp folders: lock-free ones, and lockless ones older than 10 minutes (a
// cleaner died midway).
void clean_cache_orphans(const std::string& tmp_root) {
  const std::vector<std::string> names = folder_names(tmp_root);
  const std::unordered_set<std::string> locked = clean_locked_orphans(tmp_root, "x-", names, false);
  const time_t now = std::time(nullptr);
  for (const std::string& name : names) {
    const std::string full = tmp_root + "/" + name;
    struct stat st{};
    if (locked.count(name) || lstat(full.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) continue;
    if (access((full + ".lock").c_str(), F_OK) == 0) continue;
    if (now - st.st_mtime > kOrphanAgeSeconds) remove_tree(full);
  }
}

std::string tmpdir() {
  const char* base = std::getenv(AOTPACK_ENV_TMPDIR);
  return base && *base ? base : "/tmp";
}

// ---- the cache's folders ----

struct CacheDirs {
  std::string root, tmp;  // both "" when the cache is off or unusable
};

// The cache's root and tmp folder after checking every level of the path, or {} (with a
// one-line warning when a level is unsafe; silently when the home is read-only).
CacheDirs usable_cache() {
  const std::string root = Extraction::cache_root();
  if (root.empty()) return {};
  const std::string aotpack_dir = root.substr(0, root.rfind('/'));
  const std::string base = aotpack_dir.substr(0, aotpack_dir.rfind('/'));
  if (!mkdirs(base)) return {};
  struct stat st{};
  std::string problem;
  // The folder holding ours may be shared (/tmp), but then sticky: no one renames ours.
  if (stat(base.c_str(), &st) != 0 || !S_ISDIR(st.st_mode))
    problem = "'" + base + "' is not a folder";
  else if ((st.st_uid != geteuid() && st.st_uid != 0) ||
           ((st.st_mode & 022) != 0 && (st.st_mode & S_ISVTX) == 0))
    problem = "others can write to '" + base + "'";
  bool read_only = false;
  for (const std::string& level : {aotpack_dir, root, root + "/tmp"}) {
    if (problem.empty()) problem = private_folder_problem(level, &read_only);
  }
  if (problem.empty()) return CacheDirs{root, root + "/tmp"};
  if (read_only) return {};
  warn("not using the extraction cache: " + problem + "; extracting to a private folder");
  return {};
}

// AOTPACK_RUNTIME_CACHE_MB in bytes (default 4096 MiB).
uint64_t cache_cap_bytes() {
  const char* text = std::getenv(AOTPACK_ENV_RUNTIME_CACHE_MB);
  if (!text || !*text) return kDefaultCapMiB << 20;
  char* end = nullptr;
  errno = 0;
  const unsigned long long mib = std::strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0 || text[0] == '-' || mib > (UINT64_MAX >> 20))
    fail(std::string(AOTPACK_ENV_RUNTIME_CACHE_MB " must be a whole number of MiB, got '") + text + "'");
  return static_cast<uint64_t>(mib) << 20;
}

bool is_entry_name(const std::string& name) {
  return name.size() == 64 &&
         std::all_of(name.begin(), name.end(), [](char c) { return std::isxdigit(c) && !std::isupper(c); });
}

// Entries beyond `cap` bytes, least recently used first (the lock file's mtime), are moved
// into tmp and removed when no process holds their lock; `keep` stays.
void evict_over_cap(const std::string& root, const std::string& tmp_root, const std::string& keep,
                    uint64_t cap) {
  struct Candidate {
    time_t used;
    uint64_t bytes;
    std::string path;
  };
  std::vector<Candidate> entries;
  uint64_t total = 0;
  for (const std::string& name : folder_names(root)) {
    if (!is_entry_name(name)) continue;
    const std::string path = root + "/" + name;
    const std::string marker = read_small(path + "/" + kMarker, 4096);
    const size_t at = marker.find("\nbytes ");
    uint64_t bytes = at == std::string::npos ? 0 : std::strtoull(marker.c_str() + at + 7, nullptr, 10);
    if (at == std::string::npos) {  // an entry of an older runtime: measure it
      std::error_code ec;
      for (auto it = std::filesystem::recursive_directory_iterator(path, ec);
           !ec && it != std::filesystem::recursive_directory_iterator(); it.increment(ec))
        if (it->is_regular_file(ec)) bytes += it->file_size(ec);
    }
    struct stat st{};
    if (lstat((path + "/" + kEntryLock).c_str(), &st) != 0 && lstat(path.c_str(), &st) != 0) continue;
    total += bytes;
    if (path != keep) entries.push_back(Candidate{st.st_mtime, bytes, path});
  }
  std::sort(entries.begin(), entries.end(),
            [](const Candidate& a, const Candidate& b) { return a.used < b.used; });
  for (const Candidate& candidate : entries) {
    if (total <= cap) return;
    const int fd = ::open((candidate.path + "/" + kEntryLock).c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0) {  // in use
      ::close(fd);
      continue;
    }
    if (remove_entry(candidate.path, tmp_root)) total -= candidate.bytes;
    if (fd >= 0) ::close(fd);
  }
}

size_t longest_path(const Manifest& manifest) {
  size_t longest = std::strlen(kManifestSignaturePath);
  for (const auto& [path, record] : manifest.files) longest = std::max(longest, path.size());
  return longest;
}

}  // namespace

// ---- Extraction ----

std::string Extraction::cache_root() {
  const char* off = std::getenv(AOTPACK_ENV_RUNTIME_CACHE);
  if (off && std::string(off) == "0") return "";
  const char* xdg = std::getenv(AOTPACK_ENV_XDG_CACHE_HOME);
  std::string base;
  if (xdg && xdg[0] == '/') {
    base = xdg;
  } else {
    const char* home = std::getenv(AOTPACK_ENV_HOME);
    if (!home || home[0] != '/') return "";
    base = std::string(home) + "/.cache";
  }
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  return base + "/aotpack/runtime";
}

Extraction Extraction::open(const std::string& archive_path, const Limits& limits,
                            const Options& options,
                            const std::function<void(const Manifest&)>& check,
                            Manifest* manifest) {
  // Only the manifest entries are read unless the files must be extracted or verified:
  // the entry is named by the manifest's sha256, which pins every file's sha256 and size.
  VerifiedArchive archive(archive_path, limits, options.trusted_keys);
  check(archive.manifest());
  *manifest = archive.manifest();
  CacheDirs dirs = options.use_cache ? usable_cache() : CacheDirs{};
  if (!dirs.root.empty()) {
    cache_cap_bytes();  // a bad AOTPACK_RUNTIME_CACHE_MB is a load error, not a silent default
    clean_cache_orphans(dirs.tmp);
    if (dirs.root.size() + 66 + longest_path(archive.manifest()) >= PATH_MAX) {
      warn("the archive's paths are too long for an extraction-cache entry under '" + dirs.root +
           "'; extracting to a private folder");
      dirs = CacheDirs{};
    }
  }
  Extraction result;
  if (!dirs.root.empty()) {
    result.entry_ = dirs.root + "/" + archive.manifest_sha256();
    result.state_ = acquire_state(result.entry_);
    result.proving_ = std::unique_lock<std::mutex>(result.state_->proving);
    CacheEntryState& state = *result.state_;
    struct stat held{}, named{};
    if (state.proven && (fstat(state.lock_fd, &held) != 0 ||
                         lstat((result.entry_ + "/" + kEntryLock).c_str(), &named) != 0 ||
                         held.st_ino != named.st_ino || held.st_dev != named.st_dev)) {
      state.proven = false;  // moved away by another process since: prove it again
      ::close(state.lock_fd);
      state.lock_fd = -1;
    }
    if (state.proven) {  // proven by a load in this process that still uses it
      if (options.verify_archive) archive.extract_to("");
      result.weights_ = map_weights(result.entry_, archive.manifest());
    } else {
      Proof proof = prove_entry(result.entry_, archive);
      if (proof.problem.empty()) {
        try {
          if (options.verify_archive) archive.extract_to("");
        } catch (...) {
          ::close(proof.lock_fd);
          throw;
        }
        state.proven = true;
        state.lock_fd = proof.lock_fd;
        result.weights_ = std::move(proof.weights);
      } else if (proof.exists) {
        if (proof.hostile)
          warn("extraction-cache entry failed its check (" + proof.problem +
               "): moved aside and extracted again");
        remove_entry(result.entry_, dirs.tmp);
      }
    }
    if (state.proven) {
      futimens(state.lock_fd, nullptr);  // last use, for eviction
      result.path_ = result.entry_;
      result.proving_.unlock();
      return result;
    }
  }
  PrivateFolder folder;
  if (dirs.tmp.empty()) {
    const std::string dir = tmpdir();
    clean_locked_orphans(dir, kPrivatePrefix, folder_names(dir), true);
    folder = make_private_folder(dir, kPrivatePrefix);
  } else {
    folder = make_private_folder(dirs.tmp, "x-");
  }
  result.path_ = folder.path;
  result.lock_path_ = folder.lock_path;
  result.lock_fd_ = folder.lock_fd;
  archive.extract_to(result.path_);
  check_file_contents(archive.manifest(), result.path_);
  result.weights_ = map_weights(result.path_, archive.manifest());
  if (!result.entry_.empty()) {
    const int fd = create_new_file(result.path_, kMarker, 0644);
    const std::string marker = marker_text(archive.manifest_sha256(), entry_bytes(archive));
    try {
      write_all(fd, marker.data(), marker.size(), result.path_ + "/" + kMarker);
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (::close(fd) != 0) fail("cannot write '" + result.path_ + "/" + kMarker + "'");
  }
  return result;  // still proving_: publish() or the destructor lets the next load in
}

void Extraction::publish() noexcept {
  if (!entry_.empty() && path_ != entry_) {
    const std::string lock = path_ + "/" + kEntryLock;
    const int fd = ::open(lock.c_str(), O_RDONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
    bool published = false;
    if (fd >= 0 && flock(fd, LOCK_SH) == 0) {
      const std::string root = entry_.substr(0, entry_.rfind('/'));
      for (int attempt = 0; attempt < 3 && !published; ++attempt) {
        published = rename(path_.c_str(), entry_.c_str()) == 0;
        // Another process published it meanwhile (or a poisoned one came back): ours is proven.
        if (!published && ((errno != EEXIST && errno != ENOTEMPTY) || !remove_entry(entry_, root + "/tmp")))
          break;
      }
      if (published) {
        state_->proven = true;
        state_->lock_fd = fd;
        path_ = entry_;
        ::unlink(lock_path_.c_str());
        ::close(lock_fd_);
        lock_path_.clear();
        lock_fd_ = -1;
        try {
          evict_over_cap(root, root + "/tmp", entry_, cache_cap_bytes());
        } catch (const std::exception&) {  // the cap was read at open(): cannot fail here
        }
      }
    }
    if (!published && fd >= 0) ::close(fd);
  }
  if (proving_.owns_lock()) proving_.unlock();
}

Extraction::Extraction(Extraction&& other) noexcept { *this = std::move(other); }

Extraction& Extraction::operator=(Extraction&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    entry_ = std::move(other.entry_);
    lock_path_ = std::move(other.lock_path_);
    lock_fd_ = other.lock_fd_;
    state_ = std::move(other.state_);
    proving_ = std::move(other.proving_);
    weights_ = std::move(other.weights_);
    other.path_.clear();
    other.entry_.clear();
    other.lock_path_.clear();
    other.lock_fd_ = -1;
  }
  return *this;
}

Extraction::~Extraction() { release(); }

void Extraction::release() noexcept {
  if (proving_.owns_lock()) proving_.unlock();
  if (!lock_path_.empty()) {  // a private folder
    remove_tree(path_);
    ::unlink(lock_path_.c_str());
    ::close(lock_fd_);
  }
  if (state_) drop_state(entry_, state_);
  proving_ = std::unique_lock<std::mutex>();
  state_.reset();
  weights_.reset();
  path_.clear();
  entry_.clear();
  lock_path_.clear();
  lock_fd_ = -1;
}

}  // namespace aotpack::detail
