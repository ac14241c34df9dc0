// Ed25519 signatures over manifest.json (docs/archive.md, "Integrity and signatures"),
// verified with OpenSSL EVP.
#pragma once

#include <string>
#include <vector>

namespace aotpack::detail {

/// Trusted public keys: the PEM files named in $AOTPACK_TRUSTED_KEYS (colon-separated
/// paths; empty or unset = none). Returns the paths; an empty list means signatures are
/// not required.
std::vector<std::string> trusted_key_paths();

/// Throws unless `signature` (64 raw bytes) is a valid Ed25519 signature of `message` by
/// one of the public keys in `key_paths` (PEM "PUBLIC KEY" files). Throws aotpack::Error
/// naming a key file that cannot be read or is not an Ed25519 public key.
void verify_signature(const std::string& message, const std::string& signature,
                      const std::vector<std::string>& key_paths);

}  // namespace aotpack::detail
