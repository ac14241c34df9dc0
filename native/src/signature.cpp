#include "signature.h"

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "aotpack/env_vars.h"
#include "sha256.h"
#include "util.h"

namespace aotpack::detail {
namespace {

using KeyPtr = std::unique_ptr<EVP_PKEY, void (*)(EVP_PKEY*)>;

KeyPtr load_public_key(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "rb");
  if (!file) fail("cannot read trusted key '" + path + "'");
  EVP_PKEY* key = PEM_read_PUBKEY(file, nullptr, nullptr, nullptr);
  std::fclose(file);
  if (!key || EVP_PKEY_id(key) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(key);
    fail("trusted key '" + path + "' is not an Ed25519 public key in PEM form");
  }
  return KeyPtr(key, EVP_PKEY_free);
}

bool verifies(EVP_PKEY* key, const std::string& message, const std::string& signature) {
  std::unique_ptr<EVP_MD_CTX, void (*)(EVP_MD_CTX*)> ctx(EVP_MD_CTX_new(), EVP_MD_CTX_free);
  if (!ctx || EVP_DigestVerifyInit(ctx.get(), nullptr, nullptr, nullptr, key) != 1)
    fail("OpenSSL Ed25519 initialisation failed");
  return EVP_DigestVerify(ctx.get(), reinterpret_cast<const unsigned char*>(signature.data()),
                          signature.size(),
                          reinterpret_cast<const unsigned char*>(message.data()),
                          message.size()) == 1;
}

// Hex sha256 of the key's DER SubjectPublicKeyInfo: names the key, whatever file holds it.
std::string fingerprint(EVP_PKEY* key, const std::string& path) {
  unsigned char* der = nullptr;
  const int size = i2d_PUBKEY(key, &der);
  if (size <= 0) fail("cannot encode trusted key '" + path + "'");
  std::string bytes(reinterpret_cast<const char*>(der), static_cast<size_t>(size));
  OPENSSL_free(der);
  return sha256_hex(bytes);
}

}  // namespace

std::vector<std::string> trusted_key_paths() {
  std::vector<std::string> paths;
  const char* raw = std::getenv(AOTPACK_ENV_TRUSTED_KEYS);
  if (raw == nullptr) return paths;
  const std::string all = raw;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(':', start);
    if (end == std::string::npos) end = all.size();
    if (end > start) paths.push_back(all.substr(start, end - start));
    start = end + 1;
  }
  if (paths.empty())
    fail(AOTPACK_ENV_TRUSTED_KEYS " is set but names no key: '" + all +
         "'; set it to colon-separated PEM public key files, or unset it to load unsigned "
         "archives");
  return paths;
}

bool signature_required_by_env() {
  const char* raw = std::getenv(AOTPACK_ENV_REQUIRE_SIGNATURE);
  if (raw == nullptr || *raw == '\0' || std::string(raw) == "0") return false;
  if (std::string(raw) == "1") return true;
  fail(std::string(AOTPACK_ENV_REQUIRE_SIGNATURE " must be 0 or 1, got '") + raw + "'");
}

SigningKey verify_signature(const std::string& message, const std::string& signature,
                            const std::vector<std::string>& key_paths) {
  std::vector<KeyPtr> keys;
  for (const std::string& path : key_paths) keys.push_back(load_public_key(path));
  if (signature.size() != 64) fail("manifest.sig is not a 64-byte Ed25519 signature");
  for (size_t i = 0; i < keys.size(); ++i)
    if (verifies(keys[i].get(), message, signature))
      return {key_paths[i], fingerprint(keys[i].get(), key_paths[i])};
  fail("manifest.sig does not verify with any trusted key (" + std::to_string(keys.size()) +
       " in AOTPACK_TRUSTED_KEYS/--trusted-key): the archive was modified or signed by "
       "someone else");
}

}  // namespace aotpack::detail
