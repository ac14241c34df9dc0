// The CPU's instruction-set features against a manifest's target_isa.
#pragma once

#include <string>
#include <vector>

#include "../../manifest.h"

namespace aotpack::detail {

/// The features of `features` this CPU lacks, each as a message fragment ("avx512f", or
/// "'foo' (unknown feature name)"). Names are matched case-insensitively, ignoring '.',
/// '_' and '-', so "sse4.2", "sse4_2" and "avx512_vnni" (the /proc/cpuinfo spelling) work.
std::vector<std::string> missing_cpu_features(const std::vector<std::string>& features);

/// Throws aotpack::Error "this CPU lacks avx512f, ... required by target_isa (march=...)"
/// unless this CPU has every feature of the manifest's target_isa.features.
void check_cpu_target(const Manifest& manifest);

}  // namespace aotpack::detail
