/**
 * @file error.hpp
 * @brief The exceptions gradzip throws on the host.
 *
 * - `gradzip::invalid_argument`: a bad parameter or buffer; the message names the parameter and
 *   the value, e.g. `"topk: ratio must be in (0, 1], got 1.5"`.
 * - `gradzip::format_error`: bytes that are not a valid payload; `code()` says what was wrong.
 * - `gradzip::cuda_error`: a failed CUDA runtime call.
 *
 * All derive from `gradzip::error`, itself a `std::runtime_error`. Device code never throws: it
 * writes a status word that the host turns into one of these.
 *
 * @code
 * try { codec.decompress_add(exec, gradzip::span<const std::byte>(payload), gradzip::span<float>(accum)); }
 * catch (const gradzip::format_error& e) { std::fprintf(stderr, "%s\n", e.what()); }   // e.code(): format_errc
 * @endcode
 */
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

#include "gradzip/wire/errc.hpp"

namespace gradzip {

class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class invalid_argument : public error {
 public:
  using error::error;
};

class format_error : public error {
 public:
  format_error(wire::format_errc code, const std::string& what) : error(what), code_(code) {}
  wire::format_errc code() const noexcept { return code_; }

 private:
  wire::format_errc code_;
};

class cuda_error : public error {
 public:
  using error::error;
};

namespace detail {

/// Joins any streamable values into one message string.
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream out;
  (out << ... << parts);
  return out.str();
}

}  // namespace detail
}  // namespace gradzip

/// Throws gradzip::invalid_argument with the joined message parts unless `cond` holds.
#define GRADZIP_EXPECTS(cond, ...)                                          \
  do {                                                                      \
    if (!(cond)) throw ::gradzip::invalid_argument(::gradzip::detail::concat(__VA_ARGS__)); \
  } while (0)
