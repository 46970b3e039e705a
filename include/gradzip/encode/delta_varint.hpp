/**
 * @file delta_varint.hpp
 * @brief `encode::delta_varint`: sorted indices as gaps, in a group varint with a chunk table.
 *
 * Index j is sent as its gap g_j = idx_j - idx_{j-1} - 1 (idx_{-1} = -1), so any sequence of
 * gaps decodes to strictly increasing indices; the decoder only checks that they stay below n.
 * Gaps are grouped by four: one control byte holds four 2-bit length codes (slot s in bits
 * 2s..2s+1), and the gaps' bytes follow, little-endian, in a separate data area. Lengths are
 * {1, 2, 3, 4} bytes when n < 2^32 and {1, 2, 4, 8} bytes otherwise (the "gap width" parameter).
 * Every gap uses the shortest length that holds it, so the encoding of a set of indices is
 * unique, and the decoder rejects any other (no overlong varints).
 *
 * Every 1024 indices form a chunk; a table at the front gives each chunk's first base
 * (idx of its first element minus its gap) and the offset of its data, so chunks encode and
 * decode in parallel. The decoder checks every entry against the data it indexes.
 *
 * Section layout for k indices, C = ceil(k / 1024) chunks, G = ceil(k / 4) groups:
 *
 *     C x {u64 base, u64 data offset}  |  G control bytes  |  data bytes
 *
 * Bytes per selected element: about 1 + 1/4 for gaps below 256 (densities above ~1 %), 2.25
 * for gaps below 65536, plus 16/1024 for the table. The section's size depends on the data, so
 * `max_compressed_bytes` is a bound and `compress` returns the size.
 *
 * @code
 * gradzip::codec<gradzip::sparsify::topk, gradzip::quantize::none, gradzip::encode::delta_varint>
 *     c{gradzip::sparsify::topk::ratio(0.01)};
 * @endcode
 */
#pragma once

#include <cstdint>
#include <cstring>

#include "gradzip/core/config.hpp"
#include "gradzip/wire/format.hpp"

// The SSE4.1 group decoder exists in host code, nvcc's host pass included (a .cu file's host
// decodes, the Python module's CUDA build); never in device code.
#if defined(__SSE4_1__) && !defined(__CUDA_ARCH__)
#include <smmintrin.h>
#define GRADZIP_DELTA_VARINT_SSE 1
#endif

namespace gradzip::encode {

#if defined(GRADZIP_DELTA_VARINT_SSE)
namespace detail {
/// Per control byte (4-byte gap width): the byte shuffle that spreads a group's four gaps
/// into 32-bit lanes, each lane's smallest canonical value, and the group's data bytes.
struct group_varint_tables {
  alignas(16) std::uint8_t shuffle[256][16];
  alignas(16) std::uint32_t minimum[256][4];
  std::uint8_t bytes[256];
  constexpr group_varint_tables() : shuffle{}, minimum{}, bytes{} {
    for (unsigned ctrl = 0; ctrl < 256; ++ctrl) {
      unsigned at = 0;
      for (unsigned s = 0; s < 4; ++s) {
        const unsigned code = (ctrl >> (2 * s)) & 3;
        for (unsigned b = 0; b < 4; ++b) shuffle[ctrl][4 * s + b] = b <= code ? static_cast<std::uint8_t>(at + b) : 0x80;
        minimum[ctrl][s] = code == 0 ? 0u : 1u << (8 * code);
        at += code + 1;
      }
      bytes[ctrl] = static_cast<std::uint8_t>(at);
    }
  }
};
inline constexpr group_varint_tables group_varint{};
}  // namespace detail
#endif

struct delta_varint {
  static constexpr std::uint8_t id = 3;
  /// Bytes of this stage in the params section: gap width, log2 of the chunk size, 6 zero bytes.
  static constexpr std::uint64_t param_bytes = 8;
  static constexpr bool staged = true;
  static constexpr unsigned log2_chunk = 10;
  static constexpr std::uint64_t chunk = std::uint64_t{1} << log2_chunk;
  static constexpr std::uint64_t entry_bytes = 16;

  GRADZIP_HOST_DEVICE static constexpr int gap_width(std::uint64_t n) {
    return n < (std::uint64_t{1} << 32) ? 4 : 8;
  }

  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* p, std::uint64_t n) {
    p[0] = static_cast<std::uint8_t>(gap_width(n));
    p[1] = static_cast<std::uint8_t>(log2_chunk);
  }

  GRADZIP_HOST_DEVICE static wire::status check_params(const std::uint8_t* p, std::uint64_t n,
                                                       std::uint64_t at) {
    if (p[0] != gap_width(n)) return wire::fail(wire::format_errc::bad_params, at, p[0], gap_width(n));
    if (p[1] != log2_chunk) return wire::fail(wire::format_errc::bad_params, at + 1, p[1], log2_chunk);
    for (int i = 2; i < 8; ++i) {
      if (p[i] != 0) return wire::fail(wire::format_errc::nonzero_reserved, at + i);
    }
    return {};
  }

  GRADZIP_HOST_DEVICE static constexpr std::uint64_t chunks(std::uint64_t k) {
    return (k + chunk - 1) / chunk;
  }
  /// Where the data bytes start in the section: after the chunk table and the control bytes.
  GRADZIP_HOST_DEVICE static constexpr std::uint64_t data_at(std::uint64_t k) {
    return chunks(k) * entry_bytes + (k + 3) / 4;
  }
  /// The smallest section k indices can take (every gap one byte)...
  GRADZIP_HOST_DEVICE static constexpr std::uint64_t min_section_bytes(std::uint64_t k) {
    return data_at(k) + k;
  }
  /// ...and the largest (every gap at full width).
  GRADZIP_HOST_DEVICE static constexpr std::uint64_t max_section_bytes(std::uint64_t k, std::uint64_t n) {
    return data_at(k) + k * static_cast<std::uint64_t>(gap_width(n));
  }

  /// Bytes of a gap with length code `code`.
  GRADZIP_HOST_DEVICE static constexpr unsigned length_of(int width, unsigned code) {
    return width == 4 ? code + 1 : 1u << code;
  }
  /// The shortest length code that holds `gap`.
  GRADZIP_HOST_DEVICE static constexpr unsigned code_of(int width, std::uint64_t gap) {
    const unsigned top = width == 4 ? 24 : 32;  // the third code's limit: 3 or 4 bytes
    return static_cast<unsigned>(gap >= (std::uint64_t{1} << 8)) +
           static_cast<unsigned>(gap >= (std::uint64_t{1} << 16)) +
           static_cast<unsigned>(gap >= (std::uint64_t{1} << top));
  }

  /// The gap of sorted index j.
  GRADZIP_HOST_DEVICE static std::uint64_t gap_at(const std::uint64_t* idx, std::uint64_t j) {
    return j == 0 ? idx[0] : idx[j] - idx[j - 1] - 1;
  }

  /// Data bytes of chunk c of the sorted indices idx[0..k).
  GRADZIP_HOST_DEVICE static std::uint64_t chunk_data_bytes(const std::uint64_t* idx, std::uint64_t k,
                                                            int width, std::uint64_t c) {
    std::uint64_t bytes = 0;
    const std::uint64_t last = c * chunk + chunk < k ? c * chunk + chunk : k;
    for (std::uint64_t j = c * chunk; j < last; ++j) bytes += length_of(width, code_of(width, gap_at(idx, j)));
    return bytes;
  }

  /// Writes chunk c: its table entry, control bytes and data (at `data_offset` in the data area).
  GRADZIP_HOST_DEVICE static void write_chunk(std::uint8_t* section, const std::uint64_t* idx,
                                              std::uint64_t k, int width, std::uint64_t c,
                                              std::uint64_t data_offset) {
    const std::uint64_t first = c * chunk;
    const std::uint64_t last = first + chunk < k ? first + chunk : k;
    wire::detail::store_le(section + c * entry_bytes, first == 0 ? 0 : idx[first - 1] + 1, 8);
    wire::detail::store_le(section + c * entry_bytes + 8, data_offset, 8);
    std::uint8_t* control = section + chunks(k) * entry_bytes;
    std::uint8_t* data = section + data_at(k) + data_offset;
    for (std::uint64_t j = first; j < last; j += 4) {
      unsigned ctrl = 0;
      for (unsigned s = 0; s < 4 && j + s < last; ++s) {
        const std::uint64_t gap = gap_at(idx, j + s);
        const unsigned code = code_of(width, gap);
        const unsigned len = length_of(width, code);
        wire::detail::store_le(data, gap, static_cast<int>(len));
        data += len;
        ctrl |= code << (2 * s);
      }
      control[j / 4] = static_cast<std::uint8_t>(ctrl);
    }
  }

  /**
   * Decodes chunk c of a section of `size` bytes (at least min_section_bytes(k), which the codec's
   * parse guarantees), calling f(j, index) for each of its elements in order. Checks every
   * length code (canonical, in bounds), every index (< n), its table entry, and that the next
   * chunk's base continues where this chunk ends; stops at the first failure.
   */
  GRADZIP_EXEC_CHECK_DISABLE
  template <class F>
  GRADZIP_HOST_DEVICE static wire::status decode_chunk(const std::uint8_t* section, std::uint64_t size,
                                                       std::uint64_t k, std::uint64_t n, int width,
                                                       std::uint64_t c, F&& f) {
    using wire::format_errc;
    const std::uint64_t chunk_count = chunks(k);
    const std::uint64_t data_size = size - data_at(k);
    const std::uint8_t* entry = section + c * entry_bytes;
    std::uint64_t base = wire::detail::load_le(entry, 8);
    const std::uint64_t begin = wire::detail::load_le(entry + 8, 8);
    const std::uint64_t end = c + 1 < chunk_count ? wire::detail::load_le(entry + entry_bytes + 8, 8) : data_size;
    if (c == 0 && base != 0) return wire::fail(format_errc::bad_chunk_table, 0, base, 0);
    if (c == 0 && begin != 0) return wire::fail(format_errc::bad_chunk_table, 0, begin, 0);
    if (base > n) return wire::fail(format_errc::index_out_of_range, c * chunk, base, n);
    if (end > data_size) return wire::fail(format_errc::bad_chunk_table, c + 1, end, data_size);  // c + 1's entry
    if (begin > end) return wire::fail(format_errc::bad_chunk_table, c, begin, end);

    const std::uint8_t* control = section + chunk_count * entry_bytes;
    const std::uint8_t* data = section + data_at(k);
    const bool wide_loads = end + 8 <= data_size;  // 8-byte loads stay inside the section
    const std::uint64_t last = c * chunk + chunk < k ? c * chunk + chunk : k;
    std::uint64_t at = begin;
    std::uint64_t j = c * chunk;
#if defined(GRADZIP_DELTA_VARINT_SSE)
    if (!GRADZIP_DEVICE_CODE() && width == 4 && end + 16 <= data_size) {
      j = decode_groups4_sse(data, control, j, last, end, n, at, base, f);
    }
#endif
#if !defined(__CUDA_ARCH__)  // host-only fast path (the SIMT backend runs the device's loop)
    if (!GRADZIP_DEVICE_CODE() && width == 4 && wide_loads) j = decode_groups4(data, control, j, last, end, n, at, base, f);
#endif
    for (; j < last; j += 4) {
      const unsigned ctrl = control[j / 4];
      const unsigned slots = last - j < 4 ? static_cast<unsigned>(last - j) : 4u;
      if (slots < 4 && (ctrl >> (2 * slots)) != 0) {  // an unused slot's code is set: name the first
        unsigned unused = slots;
        while (((ctrl >> (2 * unused)) & 3) == 0) ++unused;
        return wire::fail(format_errc::non_canonical_varint, j + unused, (ctrl >> (2 * unused)) & 3, 0);
      }
      std::uint64_t group_bytes = 0;
      for (unsigned s = 0; s < slots; ++s) group_bytes += length_of(width, (ctrl >> (2 * s)) & 3);
      if (group_bytes > end - at) {
        return wire::fail(format_errc::varint_overrun, c, at - begin + group_bytes, end - begin);
      }
      for (unsigned s = 0; s < slots; ++s) {
        const unsigned code = (ctrl >> (2 * s)) & 3;
        const unsigned len = length_of(width, code);
        const std::uint64_t gap = load_gap(data + at, len, wide_loads);
        if (code != code_of(width, gap)) {
          return wire::fail(format_errc::non_canonical_varint, j + s, code, code_of(width, gap));
        }
        if (gap >= n - base) return wire::fail(format_errc::index_out_of_range, j + s, base + gap, n);
        f(j + s, base + gap);
        base += gap + 1;
        at += len;
      }
    }
    if (at != end) return wire::fail(format_errc::varint_overrun, c, at - begin, end - begin);
    if (c + 1 < chunk_count) {
      const std::uint64_t next_base = wire::detail::load_le(entry + entry_bytes, 8);
      if (next_base != base) return wire::fail(format_errc::bad_chunk_table, c + 1, next_base, base);
    }
    return {};
  }

 private:
  /// The common case on the host, 4-byte gaps in whole groups: four loads at offsets the control
  /// byte alone gives, the checks folded into one branch per group. Decodes groups from j until
  /// the last whole one or the first that fails to decode cleanly (out of bounds, overlong, or
  /// reaching n), calling f, advancing `at` and `base`; returns where it stopped, for the
  /// per-slot loop to finish (and name the exact error).
  template <class F>
  static std::uint64_t decode_groups4(const std::uint8_t* data, const std::uint8_t* control, std::uint64_t j,
                                      std::uint64_t last, std::uint64_t end, std::uint64_t n, std::uint64_t& at_ref,
                                      std::uint64_t& base_ref, F& f) {
    std::uint64_t at = at_ref, base = base_ref;  // locals: f's stores cannot alias them
    for (; j + 4 <= last; j += 4) {
      const unsigned ctrl = control[j / 4];
      const unsigned c0 = ctrl & 3, c1 = (ctrl >> 2) & 3, c2 = (ctrl >> 4) & 3, c3 = ctrl >> 6;
      const std::uint64_t o1 = c0 + 1, o2 = o1 + c1 + 1, o3 = o2 + c2 + 1, total = o3 + c3 + 1;
      if (total > end - at) break;
      const std::uint8_t* p = data + at;
      const std::uint64_t g0 = load_masked(p, c0), g1 = load_masked(p + o1, c1);
      const std::uint64_t g2 = load_masked(p + o2, c2), g3 = load_masked(p + o3, c3);
      // Canonical: a gap of code c > 0 has a nonzero top byte. Bitwise, not short-circuit:
      // codes vary from group to group, and a branch on each would mispredict.
      const bool overlong = ((c0 != 0) & ((g0 >> (8 * c0)) == 0)) | ((c1 != 0) & ((g1 >> (8 * c1)) == 0)) |
                            ((c2 != 0) & ((g2 >> (8 * c2)) == 0)) | ((c3 != 0) & ((g3 >> (8 * c3)) == 0));
      const std::uint64_t i0 = base + g0, i1 = i0 + 1 + g1, i2 = i1 + 1 + g2, i3 = i2 + 1 + g3;
      if (overlong | (i3 >= n)) break;  // no wrap: base <= n < 2^32 and gaps < 2^32
      f(j, i0);
      f(j + 1, i1);
      f(j + 2, i2);
      f(j + 3, i3);
      base = i3 + 1;
      at += total;
    }
    at_ref = at;
    base_ref = base;
    return j;
  }

#if defined(GRADZIP_DELTA_VARINT_SSE)

  /// decode_groups4 with SSE4.1: one 16-byte load and one shuffle per group, the canonical
  /// check as a lane-wise max, the prefix sum of (gap + 1) in 64-bit lanes. Needs 16 readable
  /// bytes past every group's start (the caller checks).
  template <class F>
  static std::uint64_t decode_groups4_sse(const std::uint8_t* data, const std::uint8_t* control, std::uint64_t j,
                                          std::uint64_t last, std::uint64_t end, std::uint64_t n,
                                          std::uint64_t& at_ref, std::uint64_t& base_ref, F& f) {
    std::uint64_t at = at_ref;
    const __m128i one = _mm_set1_epi64x(1);
    // The index before the group, in both lanes (wraps for base 0: fine mod 2^64). Kept in a
    // register from group to group, so the loop-carried chain is two vector ops.
    __m128i before = _mm_set1_epi64x(static_cast<long long>(base_ref - 1));
    for (; j + 4 <= last; j += 4) {
      const unsigned ctrl = control[j / 4];
      const unsigned total = detail::group_varint.bytes[ctrl];
      if (total > end - at) break;
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(data + at));
      const __m128i gaps = _mm_shuffle_epi8(raw, _mm_load_si128(reinterpret_cast<const __m128i*>(detail::group_varint.shuffle[ctrl])));
      const __m128i minimum = _mm_load_si128(reinterpret_cast<const __m128i*>(detail::group_varint.minimum[ctrl]));
      const bool canonical = _mm_movemask_epi8(_mm_cmpeq_epi32(_mm_max_epu32(gaps, minimum), gaps)) == 0xFFFF;
      __m128i lo = _mm_add_epi64(_mm_cvtepu32_epi64(gaps), one);                     // g0 + 1, g1 + 1
      __m128i hi = _mm_add_epi64(_mm_cvtepu32_epi64(_mm_srli_si128(gaps, 8)), one);  // g2 + 1, g3 + 1
      lo = _mm_add_epi64(lo, _mm_slli_si128(lo, 8));
      hi = _mm_add_epi64(_mm_add_epi64(hi, _mm_slli_si128(hi, 8)), _mm_unpackhi_epi64(lo, lo));
      lo = _mm_add_epi64(lo, before);
      hi = _mm_add_epi64(hi, before);
      alignas(16) std::uint64_t index[4];
      _mm_store_si128(reinterpret_cast<__m128i*>(index), lo);
      _mm_store_si128(reinterpret_cast<__m128i*>(index + 2), hi);
      if (!canonical || index[3] >= n) break;  // no wrap: base <= n < 2^32 and gaps < 2^32
      f(j, index[0]);
      f(j + 1, index[1]);
      f(j + 2, index[2]);
      f(j + 3, index[3]);
      before = _mm_unpackhi_epi64(hi, hi);
      at += total;
    }
    at_ref = at;
    base_ref = static_cast<std::uint64_t>(_mm_cvtsi128_si64(before)) + 1;
    return j;
  }
#endif

  /// The low (code + 1) bytes of the 8 at p.
  static std::uint64_t load_masked(const std::uint8_t* p, unsigned code) {
    std::uint64_t v;
    std::memcpy(&v, p, 8);
    return v & (~std::uint64_t{0} >> (56 - 8 * code));
  }

  /// A gap of `len` bytes; `wide` says 8 bytes may be read (one load, then a mask).
  GRADZIP_HOST_DEVICE static std::uint64_t load_gap(const std::uint8_t* p, unsigned len, bool wide) {
#if !defined(__CUDA_ARCH__)
    if (wide && !GRADZIP_DEVICE_CODE()) {
      std::uint64_t v;
      std::memcpy(&v, p, 8);
      return len == 8 ? v : v & ((std::uint64_t{1} << (8 * len)) - 1);
    }
#endif
    (void)wide;
    return wire::detail::load_le(p, static_cast<int>(len));
  }
};

}  // namespace gradzip::encode
