// A structural check of a shared object before it is dlopen'ed, so a truncated or mangled
// .so is a clean error rather than SIGBUS/SIGSEGV inside the dynamic loader.
#pragma once

#include <string>

namespace aotpack::detail {

/// Checks the ELF file at `path` (shown as `label` in errors): magic, 64-bit class,
/// little-endian, ELF version 1, type ET_DYN, machine == this host's, header sizes, the
/// program and section header tables within the file, every program segment and every
/// section with file contents within the file (p_filesz <= p_memsz for loadable segments),
/// a PT_DYNAMIC segment, and e_shstrndx in range. Throws aotpack::Error
/// ("<label> is not a valid shared object for this host: ...").
void check_elf(const std::string& path, const std::string& label);

}  // namespace aotpack::detail
