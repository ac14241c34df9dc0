#include "device.h"

#include "aotpack/archive_layout.h"

#include "devices/cpu/cpu_device.h"
#include "util.h"

namespace aotpack::detail {
namespace {

// Every backend whose binaries are host ELF shared objects runs on the CPU device; the list
// is declared once, in aotpack/archive/layout.py (HOST_BACKENDS), beside the archive paths.
const char* const kHostBackends[] = AOTPACK_HOST_BACKENDS;

// "'cpu', 'portable'": as aotpack/archive/manifest_rules.py words the same refusal.
std::string quoted_names() {
  std::string text;
  for (const std::string& name : backend_names()) text += (text.empty() ? "'" : ", '") + name + "'";
  return text;
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const char* name : kHostBackends) names.emplace_back(name);
  return names;
}

const Device& device_for_backend(const std::string& backend) {
  for (const char* name : kHostBackends)
    if (backend == name) return cpu_device();
  fail("backend '" + backend + "' is not supported (this runtime runs " + quoted_names() + " archives)");
}

const Device& host_device() { return cpu_device(); }

}  // namespace aotpack::detail
