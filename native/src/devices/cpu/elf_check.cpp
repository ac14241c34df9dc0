#include "elf_check.h"

#include <elf.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "../../util.h"

namespace aotpack::detail {
namespace {

#if defined(__x86_64__)
constexpr uint16_t kHostMachine = EM_X86_64;
#elif defined(__aarch64__)
constexpr uint16_t kHostMachine = EM_AARCH64;
#else
#error "aotpack's ELF check knows x86-64 and aarch64 hosts only"
#endif

constexpr uint32_t kMaxHeaders = 65535;

class Checker {
 public:
  Checker(const std::string& path, const std::string& label) : label_(label) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd_ < 0) fail("cannot open " + label + ": " + std::strerror(errno));
    struct stat st{};
    if (fstat(fd_, &st) != 0) fail("cannot stat " + label + ": " + std::strerror(errno));
    size_ = static_cast<uint64_t>(st.st_size);
  }
  ~Checker() { ::close(fd_); }

  void run() {
    Elf64_Ehdr eh{};
    if (size_ < sizeof(eh)) bad("shorter than an ELF header (" + std::to_string(size_) + " bytes)");
    read_at(0, &eh, sizeof(eh));
    if (std::memcmp(eh.e_ident, ELFMAG, SELFMAG) != 0) bad("no ELF magic");
    if (eh.e_ident[EI_CLASS] != ELFCLASS64) bad("not a 64-bit ELF file");
    if (eh.e_ident[EI_DATA] != ELFDATA2LSB) bad("not little-endian");
    if (eh.e_ident[EI_VERSION] != EV_CURRENT || eh.e_version != EV_CURRENT) bad("unknown ELF version");
    if (eh.e_type != ET_DYN) bad("not a shared object (e_type " + std::to_string(eh.e_type) + ")");
    if (eh.e_machine != kHostMachine)
      bad("built for machine " + std::to_string(eh.e_machine) + ", this host is " +
          std::to_string(kHostMachine));
    if (eh.e_ehsize != sizeof(Elf64_Ehdr)) bad("unexpected ELF header size");
    check_programs(eh);
    check_sections(eh);
  }

 private:
  [[noreturn]] void bad(const std::string& what) const {
    fail(label_ + " is not a valid shared object for this host: " + what);
  }

  void read_at(uint64_t offset, void* out, size_t n) const {
    size_t done = 0;
    while (done < n) {
      ssize_t got = ::pread(fd_, static_cast<char*>(out) + done, n - done,
                            static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) bad("cannot read it");
      done += static_cast<size_t>(got);
    }
  }

  // [offset, offset + length) inside the file, without overflow.
  bool within(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

  template <class Header>
  std::vector<Header> table(uint64_t offset, uint32_t count, uint32_t entsize, const char* what) {
    if (count == 0) return {};
    if (entsize != sizeof(Header)) bad(std::string("unexpected ") + what + " header size");
    if (count > kMaxHeaders || !within(offset, uint64_t{count} * entsize))
      bad(std::string(what) + " header table lies outside the file (truncated?)");
    std::vector<Header> headers(count);
    read_at(offset, headers.data(), count * sizeof(Header));
    return headers;
  }

  void check_programs(const Elf64_Ehdr& eh) {
    auto phdrs = table<Elf64_Phdr>(eh.e_phoff, eh.e_phnum, eh.e_phentsize, "program");
    if (phdrs.empty()) bad("no program headers");
    bool dynamic = false;
    for (size_t i = 0; i < phdrs.size(); ++i) {
      const Elf64_Phdr& p = phdrs[i];
      if (!within(p.p_offset, p.p_filesz))
        bad("segment " + std::to_string(i) + " lies outside the file (truncated?)");
      if (p.p_type == PT_LOAD && p.p_filesz > p.p_memsz)
        bad("segment " + std::to_string(i) + " has more file bytes than memory bytes");
      dynamic = dynamic || p.p_type == PT_DYNAMIC;
    }
    if (!dynamic) bad("no PT_DYNAMIC segment");
  }

  void check_sections(const Elf64_Ehdr& eh) {
    auto shdrs = table<Elf64_Shdr>(eh.e_shoff, eh.e_shnum, eh.e_shentsize, "section");
    if (!shdrs.empty() && eh.e_shstrndx >= shdrs.size()) bad("section name index out of range");
    for (size_t i = 0; i < shdrs.size(); ++i) {
      const Elf64_Shdr& s = shdrs[i];
      if (s.sh_type != SHT_NOBITS && s.sh_type != SHT_NULL && !within(s.sh_offset, s.sh_size))
        bad("section " + std::to_string(i) + " lies outside the file (truncated?)");
    }
  }

  std::string label_;
  int fd_ = -1;
  uint64_t size_ = 0;
};

}  // namespace

void check_elf(const std::string& path, const std::string& label) { Checker(path, label).run(); }

}  // namespace aotpack::detail
