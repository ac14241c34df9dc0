// Can this process run the archive? torch version, backend, CPU features, ABI version.
#pragma once

#include <string>
#include <vector>

#include "manifest.h"

namespace aotpack::detail {

/// Throws aotpack::Error unless the manifest's backend, torch major.minor, target_isa
/// features and model ABI version all match this runtime and this CPU.
void check_compatibility(const Manifest& manifest);

/// The features of `features` this CPU lacks, each as a message fragment ("avx512f", or
/// "'foo' (unknown feature name)"). Names are matched case-insensitively, ignoring '.',
/// '_' and '-', so "sse4.2", "sse4_2" and "avx512_vnni" (the /proc/cpuinfo spelling) work.
std::vector<std::string> missing_cpu_features(const std::vector<std::string>& features);

}  // namespace aotpack::detail
