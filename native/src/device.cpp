#include "device.h"

#include "devices/cpu/cpu_device.h"
#include "util.h"

namespace aotpack::detail {
namespace {

struct Registration {
  const char* backend;        // the manifest's `backend`
  const Device& (*device)();  // the device that runs its archives
};

// Several names may map to one device: every backend whose binaries are host ELF objects
// runs on the CPU device.
const Registration kRegistry[] = {
    {"cpu", cpu_device},
};

// "'cpu'", "'cpu' or 'portable'", "'a', 'b' or 'c'".
std::string quoted_names() {
  const std::vector<std::string> names = backend_names();
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) {
    if (i > 0) text += i + 1 == names.size() ? " or " : ", ";
    text += "'" + names[i] + "'";
  }
  return text;
}

}  // namespace

std::vector<std::string> backend_names() {
  std::vector<std::string> names;
  for (const Registration& r : kRegistry) names.emplace_back(r.backend);
  return names;
}

const Device& device_for_backend(const std::string& backend) {
  for (const Registration& r : kRegistry)
    if (backend == r.backend) return r.device();
  fail("backend '" + backend + "' is not supported (this runtime runs " + quoted_names() + " archives)");
}

const Device& host_device() { return cpu_device(); }

}  // namespace aotpack::detail
