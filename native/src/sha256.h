// SHA-256 through OpenSSL's EVP interface: one-shot and streaming.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace aotpack::detail {

/// Lower-case hex SHA-256 of `data`; throws aotpack::Error if OpenSSL fails.
std::string sha256_hex(const std::string& data);

/// Incremental SHA-256: update() with chunks, then hex() once. Throws aotpack::Error if
/// OpenSSL fails. Move-only.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  void update(const void* data, size_t size);
  /// Lower-case hex digest of everything fed so far; the object cannot be updated after.
  std::string hex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace aotpack::detail
