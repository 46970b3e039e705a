/**
 * @file none.hpp
 * @brief `quantize::none`: the values stage that sends values unchanged, in the input's type.
 *
 * Bytes per value: sizeof(T). Exact: decoding gives back the very bits that were selected.
 */
#pragma once

#include <cstdint>

namespace gradzip::quantize {

struct none {
  static constexpr std::uint8_t id = 0;
  static constexpr std::uint64_t param_bytes = 0;
};

}  // namespace gradzip::quantize
