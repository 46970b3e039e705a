/**
 * @file none.hpp
 * @brief `encode::none`: no indices section, for structure stages that send none
 * (`sparsify::none` sends every element in order).
 */
#pragma once

#include <cstdint>

#include "gradzip/core/config.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::encode {

struct none {
  static constexpr std::uint8_t id = 0;
  static constexpr std::uint64_t param_bytes = 0;
  static constexpr bool staged = false;
  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t*, std::uint64_t) {}
  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t*, std::uint64_t, std::uint64_t) {
    return {};
  }
};

}  // namespace gradzip::encode
