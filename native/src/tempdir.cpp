#include "tempdir.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <vector>

#include "aotpack/env_vars.h"
#include "util.h"

namespace aotpack::detail {
namespace {

std::string errno_message(const std::string& what, const std::string& path) {
  return "cannot " + what + " '" + path + "': " + std::strerror(errno);
}

void make_parents(const std::string& root, const std::string& relative_path) {
  size_t slash = relative_path.find('/');
  while (slash != std::string::npos) {
    const std::string dir = root + "/" + relative_path.substr(0, slash);
    if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) fail(errno_message("create", dir));
    slash = relative_path.find('/', slash + 1);
  }
}

}  // namespace

void write_all(int fd, const char* data, size_t size, const std::string& path) {
  size_t done = 0;
  while (done < size) {
    ssize_t n = ::write(fd, data + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) fail(errno_message("write", path));
    done += static_cast<size_t>(n);
  }
}

int create_new_file(const std::string& root, const std::string& relative_path, unsigned mode) {
  make_parents(root, relative_path);
  const std::string full = root + "/" + relative_path;
  // O_EXCL | O_NOFOLLOW: never write through something that appeared there meanwhile.
  int fd = ::open(full.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
  if (fd < 0) fail(errno_message("create", full));
  return fd;
}

TempDir TempDir::create() {
  const char* base = std::getenv(AOTPACK_ENV_TMPDIR);
  std::string templ = std::string(base && *base ? base : "/tmp") + "/aotpack-XXXXXX";
  std::vector<char> buffer(templ.begin(), templ.end());
  buffer.push_back('\0');
  if (mkdtemp(buffer.data()) == nullptr) fail(errno_message("create a temp folder like", templ));
  return TempDir(std::string(buffer.data()));
}

void TempDir::write_file(const std::string& relative_path, const std::string& data,
                         unsigned mode) const {
  const std::string full = path_ + "/" + relative_path;
  int fd = create_new_file(path_, relative_path, mode);
  try {
    write_all(fd, data.data(), data.size(), full);
  } catch (...) {
    ::close(fd);
    throw;
  }
  if (::close(fd) != 0) fail(errno_message("close", full));
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::move(other.path_)) { other.path_.clear(); }

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    remove();
    path_ = std::move(other.path_);
    other.path_.clear();
  }
  return *this;
}

TempDir::~TempDir() { remove(); }

void TempDir::remove() noexcept {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
  path_.clear();
}

}  // namespace aotpack::detail
