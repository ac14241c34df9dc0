// SHA-256 through OpenSSL's EVP interface.
#pragma once

#include <string>

namespace aotpack::detail {

/// Lower-case hex SHA-256 of `data`; throws aotpack::Error if OpenSSL fails.
std::string sha256_hex(const std::string& data);

}  // namespace aotpack::detail
