// Ed25519 signatures over manifest.json (docs/archive.md, "Integrity and signatures"),
// verified with OpenSSL EVP, and the signature policy read from the environment.
#pragma once

#include <string>
#include <vector>

namespace aotpack::detail {

/// Trusted public keys: the PEM files named in $AOTPACK_TRUSTED_KEYS (colon-separated
/// paths; empty components between keys are skipped). Unset = none: signatures are not
/// required. Throws aotpack::Error when it is set but names no key ("", ":", "::"), so an
/// empty setting never turns the signature check off.
std::vector<std::string> trusted_key_paths();

/// $AOTPACK_REQUIRE_SIGNATURE: "1" = every load needs trusted keys (and so a valid
/// signature); unset, "" or "0" = not required. Throws aotpack::Error for other values.
bool signature_required_by_env();

/// The trusted key that verified a signature.
struct SigningKey {
  std::string path;    // as given (AOTPACK_TRUSTED_KEYS or a load option)
  std::string sha256;  // hex sha256 of the key's DER SubjectPublicKeyInfo
};

/// Returns the first of `key_paths` (PEM "PUBLIC KEY" files) by which `signature` (64 raw
/// bytes) is a valid Ed25519 signature of `message`; throws unless there is one. Throws
/// aotpack::Error naming a key file that cannot be read or is not an Ed25519 public key.
SigningKey verify_signature(const std::string& message, const std::string& signature,
                            const std::vector<std::string>& key_paths);

}  // namespace aotpack::detail
