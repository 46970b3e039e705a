/**
 * @file count_sketch.hpp
 * @brief `sketch::count_sketch`: a rows x columns Count Sketch of a gradient (Charikar et al.
 * 2002; FetchSGD, Rothchild et al. 2020), mergeable by summing, unsketched to its heavy hitters.
 *
 * Row r adds s_r(i) x_i into column h_r(i) of its row, for every element i. Both come from one
 * 32-bit hash f_r(i), computed on the fly: f_r is a multiply-shift function drawn from
 * (seed, r) (`multiply_shift`, random/hash.hpp), strongly universal, so the pairs
 * (h_r(i), s_r(i)) are pairwise independent across elements, which is what the estimator's
 * unbiasedness and variance bound need (Charikar et al. 2002). The top bit is the sign and the
 * low 31 bits pick the column (multiply-shift onto [0, columns)), so the sign is independent of
 * the column. Nothing is precomputed: FetchSGD's reference code stores r x n hash tables (about
 * 12 bytes per element per row).
 *
 * Sketches of the same (rows, columns, seed) and n sum element-wise to the sketch of the summed
 * gradients (`summable`: an allreduce of the table is the sketch of the sum; `merge` adds two on
 * the host). `estimate` gives every element's median-of-rows estimate; `unsketch` returns the k
 * largest estimates as a top-k payload (`codec<sparsify::topk>`), so any gradzip decoder applies
 * it.
 *
 * Cells are exact fixed-point sums (`detail::fixed_point`): each value is rounded once to a
 * multiple of 2^(E - p), where 2^E <= the largest finite magnitude < 2^(E+1) and
 * p = min(30, 61 - bit_width(n)); the signed multiples are summed exactly in 64-bit integers,
 * and each cell is rounded once to fp32. Integer sums have no order, so a sketch's bytes depend
 * only on the input and (rows, columns, seed): not on the executor, the thread count or the
 * order of the GPU's atomics. A cell that a non-finite element maps to is NaN. The input is read
 * twice per sketch, whatever the row count: once for the largest magnitude, once for the sums.
 *
 * Payload: codec id 00 06 00 00; params (u32 rows, u32 hash family 1, u64 columns, u64 seed), then the table
 * as rows x columns fp32, row-major. The header's element count is n. Host executor, and on
 * CUDA `compress`, `merge`, `estimate` and `unsketch` (detail/cuda/count_sketch.cuh: 64-bit
 * integer atomics into the cells, the host's bytes).
 *
 * @code
 * gradzip::sketch::count_sketch cs{5, n / 100, seed};
 * std::vector<std::byte> table(cs.payload_bytes(n));
 * cs.compress(exec, gradzip::span<const float>(grad), table);   // then allreduce the table, or merge
 * std::vector<std::byte> top(cs.max_unsketch_bytes(n, k));
 * top.resize(cs.unsketch(exec, table, n, k, top));   // a codec<sparsify::topk> payload of n
 * @endcode
 */
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gradzip/codec.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/detail/fixed_point.hpp"
#include "gradzip/detail/host/hash_avx2.hpp"
#include "gradzip/detail/host/parallel.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::detail {
/// Executors other than the host's (detail/cuda/count_sketch.cuh for `cuda`).
template <class Exec>
struct count_sketch_backend;
}  // namespace gradzip::detail

namespace gradzip::sketch {

class count_sketch {
 public:
  static constexpr std::uint8_t structure_id = 6;
  static constexpr wire::codec_id id{0, structure_id, 0, 0};
  static constexpr bool summable = true;
  static constexpr std::uint32_t max_rows = 31;
  /// Columns come from the hash's low 31 bits.
  static constexpr std::uint64_t max_columns = std::uint64_t{1} << 31;
  static constexpr std::uint64_t params_bytes = 24;
  /// The params' hash family: 1 = `row_hash` (multiply-shift). Readers refuse any other, so a
  /// table hashed another way is never unsketched with the wrong buckets.
  static constexpr std::uint32_t hash_family = 1;

  count_sketch(std::uint32_t rows, std::uint64_t columns, std::uint64_t seed)
      : rows_(rows), columns_(columns), seed_(seed) {
    GRADZIP_EXPECTS(rows >= 1 && rows <= max_rows, "count_sketch: rows must be in [1, ", max_rows, "], got ", rows);
    GRADZIP_EXPECTS(columns >= 1 && columns <= max_columns, "count_sketch: columns must be in [1, 2^31], got ", columns);
  }

  std::uint32_t rows() const noexcept { return rows_; }
  std::uint64_t columns() const noexcept { return columns_; }
  std::uint64_t seed() const noexcept { return seed_; }

  /// Row r's hash function f_r.
  GRADZIP_HOST_DEVICE static multiply_shift row_hash(std::uint64_t seed, std::uint32_t row) {
    return multiply_shift::from_key(hash64(seed, row));
  }
  /// f[r] <- row_hash(seed, r) for r < rows (f holds max_rows): computed once per pass.
  GRADZIP_HOST_DEVICE static void row_hashes(std::uint64_t seed, std::uint32_t rows, multiply_shift* f) {
    for (std::uint32_t r = 0; r < rows; ++r) f[r] = row_hash(seed, r);
  }
  /// f_r(i): the column from its low 31 bits, the sign from its top bit.
  GRADZIP_HOST_DEVICE static std::uint32_t hash_of(std::uint64_t seed, std::uint32_t row, std::uint64_t i) {
    return row_hash(seed, row)(i);
  }
  /// ((hash mod 2^31) columns) >> 31: multiply-shift onto [0, columns), columns <= 2^31.
  GRADZIP_HOST_DEVICE static std::uint64_t bucket_of(std::uint32_t hash, std::uint64_t columns) {
    return ((hash & 0x7FFFFFFFu) * columns) >> 31;
  }
  GRADZIP_HOST_DEVICE static float sign_of(std::uint32_t hash) { return (hash >> 31) != 0 ? -1.0f : 1.0f; }
  /// sign_of(hash) * v as a flip of v's sign bit: compilers turn a multiply by +-1 into a branch
  /// between two constants, which mispredicts on every other element. Every executor uses it.
  GRADZIP_HOST_DEVICE static float apply_sign(float v, std::uint32_t hash) {
    const auto bits = gradzip::detail::bit_cast<std::uint32_t>(v) ^ (hash & 0x80000000u);
    return gradzip::detail::bit_cast<float>(bits);
  }

  /// The largest n a sketch takes: the fixed point needs n < 2^61 (detail/fixed_point.hpp).
  static constexpr std::uint64_t max_elements = gradzip::detail::fixed_point::max_count;
  /// What a cell that a non-finite element maps to holds: gradzip's quiet NaN.
  static constexpr std::uint32_t poisoned_cell = 0x7FC00000u;

  /// Element i's value as the sketch sees it: fp32, whatever T.
  template <class T>
  GRADZIP_HOST_DEVICE static float value_of(T x) {
    return static_cast<float>(to_float(x));
  }
  /// s_r(i) q_i: the fixed point of a finite value with the sign of hash h applied.
  GRADZIP_HOST_DEVICE static std::int64_t signed_fixed(const gradzip::detail::fixed_point& fp, float v,
                                                       std::uint32_t h) {
    return signed_fixed(fp.to_fixed(v), h);
  }
  /// The same from q_i itself.
  GRADZIP_HOST_DEVICE static std::int64_t signed_fixed(std::int32_t q, std::uint32_t h) {
    return (h >> 31) != 0 ? -std::int64_t{q} : std::int64_t{q};
  }

  /// The payload layout for a sketch of n elements (its size does not depend on n).
  GRADZIP_HOST_DEVICE static wire::payload_layout layout_for(std::uint32_t rows, std::uint64_t columns) {
    wire::payload_layout l;
    l.add(wire::tag::params, params_bytes);
    l.add(wire::tag::values, static_cast<std::uint64_t>(rows) * columns * sizeof(float));
    return l;
  }
  wire::payload_layout layout() const { return layout_for(rows_, columns_); }

  /// Header, params and padding of a sketch of n elements (the table follows).
  GRADZIP_HOST_DEVICE static void write_frame(std::uint8_t* base, std::uint64_t n, std::uint32_t rows,
                                              std::uint64_t columns, std::uint64_t seed) {
    const wire::payload_layout l = layout_for(rows, columns);
    wire::write_header(base, l, element_type::f32, id, n);
    write_params(base + l.at(0).offset, rows, columns, seed);
    wire::zero_section_padding(base, l);
  }
  /// The params section's params_bytes: u32 rows, u32 hash_family, u64 columns, u64 seed.
  GRADZIP_HOST_DEVICE static void write_params(std::uint8_t* params, std::uint32_t rows, std::uint64_t columns,
                                               std::uint64_t seed) {
    for (std::uint64_t b = 0; b < params_bytes; ++b) params[b] = 0;
    wire::detail::store_le(params, rows, 4);
    wire::detail::store_le(params + 4, hash_family, 4);
    wire::detail::store_le(params + 8, columns, 8);
    wire::detail::store_le(params + 16, seed, 8);
  }

  /// Checks a parsed header against (rows, columns, seed) and, unless `n` is null, the element
  /// count; `table` receives the table's offset.
  GRADZIP_HOST_DEVICE static wire::status check_frame(const wire::header& h, const std::uint8_t* base,
                                                      const std::uint64_t* n, std::uint32_t rows, std::uint64_t columns,
                                                      std::uint64_t seed, std::uint64_t& table) {
    const wire::tag tags[2] = {wire::tag::params, wire::tag::values};
    const wire::status frame_ok = wire::expect_frame(h, id.packed(), tags, 2, params_bytes);
    if (!frame_ok.ok()) return frame_ok;
    if (h.type != element_type::f32) {  // the cells are fp32
      return wire::fail(wire::format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                        static_cast<std::uint64_t>(element_type::f32));
    }
    const wire::param_field fields[4] = {{0, 4, rows}, {4, 4, hash_family}, {8, 8, columns}, {16, 8, seed}};
    const wire::status params_ok = wire::expect_params(base, h.sections[0].offset, fields, 4);
    if (!params_ok.ok()) return params_ok;
    const std::uint64_t table_bytes = static_cast<std::uint64_t>(rows) * columns * sizeof(float);
    if (h.sections[1].size != table_bytes) return wire::fail(wire::format_errc::bad_section_size, 1, h.sections[1].size, table_bytes);
    if (n != nullptr && h.element_count != *n) return wire::fail(wire::format_errc::size_mismatch, h.element_count, *n);
    table = h.sections[1].offset;
    return wire::status{};
  }
  std::size_t payload_bytes(std::size_t /*n*/) const { return layout().total_bytes(); }

  /// On another executor (CUDA: device buffers, asynchronous; bad sketches reach exec.check()).
  template <class T, class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t workspace_bytes(Exec& exec, std::size_t n) const {
    return gradzip::detail::count_sketch_backend<Exec>::template workspace_bytes<T>(*this, exec, n);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t compress(Exec& exec, span<const T> x, span<std::byte> out) const {
    return gradzip::detail::count_sketch_backend<Exec>::compress(*this, exec, x, out);
  }
  template <class Exec, class T, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void estimate(Exec& exec, span<const std::byte> sketch, span<T> estimates) const {
    gradzip::detail::count_sketch_backend<Exec>::estimate(*this, exec, sketch, estimates);
  }
  template <class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  void merge(Exec& exec, span<std::byte> into, span<const std::byte> other) const {
    gradzip::detail::count_sketch_backend<Exec>::merge(*this, exec, into, other);
  }
  /// On another executor n is an argument (the payload's copy lives in device memory) and is
  /// checked against the payload's on the device.
  template <class Exec, std::enable_if_t<!std::is_same_v<Exec, host>, int> = 0>
  std::size_t unsketch(Exec& exec, span<const std::byte> sketch, std::uint64_t n, std::uint64_t k,
                       span<std::byte> out) const {
    return gradzip::detail::count_sketch_backend<Exec>::unsketch(*this, exec, sketch, n, k, out);
  }

  /// Sketches x into `out` (payload_bytes bytes); returns the payload's size.
  template <class T>
  std::size_t compress(host& exec, span<const T> x, span<std::byte> out) const {
    const wire::payload_layout l = layout();
    GRADZIP_EXPECTS(out.size() >= l.total_bytes(), "count_sketch::compress: output holds ", out.size(),
                    " bytes, the sketch needs ", l.total_bytes());
    expect_sketch_size(x.size());
    auto* base = reinterpret_cast<std::uint8_t*>(out.data());
    write_frame(base, x.size(), rows_, columns_, seed_);
    const magnitude m = magnitude_of(exec, x);
    sketch_rows(exec, x, gradzip::detail::fixed_point::for_values(m.max_bits, x.size()), base + l.at(1).offset);
    if (m.non_finite != 0) poison_cells(x, base + l.at(1).offset);
    return l.total_bytes();
  }
  static void expect_sketch_size(std::uint64_t n) {
    GRADZIP_EXPECTS(n <= max_elements, "count_sketch::compress: n = ", n, " exceeds ", max_elements, " elements");
  }

  /// into <- into + other: both sketches of this configuration and the same n (validated). A
  /// sealed `into` comes back unsealed (wire::unseal): its CRC would no longer match.
  void merge(host& exec, span<std::byte> into, span<const std::byte> other) const {
    const view a = parse(span<const std::byte>(into.data(), into.size()), nullptr);
    const view b = parse(other, nullptr);
    if (a.n != b.n) wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, b.n, a.n), "count_sketch::merge");
    auto* to = const_cast<std::uint8_t*>(a.table);
    const std::uint64_t cells = static_cast<std::uint64_t>(rows_) * columns_;
    const std::size_t chunks = gradzip::detail::chunk_count(exec, cells);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(cells, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) store_cell(to, j, sum_cells(load_cell(to, j), load_cell(b.table, j)));
    });
    wire::unseal(reinterpret_cast<std::uint8_t*>(into.data()));
  }

  /// A NaN as the payloads carry it, whatever made it: poisoned_cell. An x86 add keeps an
  /// operand's NaN bits (or makes 0xFFC00000 of inf - inf), a GPU makes 0x7FFFFFFF: without this
  /// the two executors' merged tables and FetchSGD states would differ.
  GRADZIP_HOST_DEVICE static float canonical(float v) {
    return v != v ? gradzip::detail::bit_cast<float>(std::uint32_t{poisoned_cell}) : v;
  }
  /// Two cells' sum, as merge adds them on every executor.
  GRADZIP_HOST_DEVICE static float sum_cells(float a, float b) { return canonical(a + b); }

  /// estimates[i] <- the median over rows of s_r(i) table[r][h_r(i)]; estimates.size() must be
  /// the sketch's n.
  template <class T>
  void estimate(host& exec, span<const std::byte> sketch, span<T> estimates) const {
    const std::uint64_t n = estimates.size();
    const view v = parse(sketch, &n);
    const std::size_t chunks = gradzip::detail::chunk_count(exec, n);
    multiply_shift f[max_rows];
    row_hashes(seed_, rows_, f);
    const bool poisoned = has_nan_cell(v.table);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(n, chunks, c);
      for_each_high_half(r.begin, r.end, [&](std::uint64_t begin, std::uint64_t end) {
        estimate_range(v.table, f, begin, end, estimates.data(), poisoned);
      });
    });
  }

  /// The table of a validated sketch of this configuration (of n elements, if given): rows x
  /// columns little-endian fp32 cells, row-major, inside `sketch`.
  const std::uint8_t* table_of(span<const std::byte> sketch, const std::uint64_t* n = nullptr) const {
    return parse(sketch, n).table;
  }
  /// Cell j of a table (little-endian fp32, possibly unaligned: it lives in a payload).
  static float load_cell(const std::uint8_t* table, std::uint64_t j) {
    float v;
    std::memcpy(&v, table + 4 * j, 4);
    return v;
  }
  static void store_cell(std::uint8_t* table, std::uint64_t j, float v) { std::memcpy(table + 4 * j, &v, 4); }

  /// The cell (row x columns + column) that element i adds into in row r.
  std::uint64_t cell_of(std::uint32_t row, std::uint64_t i) const {
    return row * columns_ + bucket_of(hash_of(seed_, row, i), columns_);
  }

  /// The largest n `unsketch` takes: its scratch, n floats plus top-k's, stays far from
  /// overflowing a 64-bit size (2^56 elements is 256 PiB of estimates).
  static constexpr std::uint64_t max_unsketch_elements = std::uint64_t{1} << 56;
  static void expect_unsketch_size(std::uint64_t n) {
    GRADZIP_EXPECTS(n <= max_unsketch_elements, "count_sketch::unsketch: n = ", n, " exceeds ",
                    max_unsketch_elements, " elements");
  }
  /// k of n, checked before anything is estimated.
  static void expect_unsketch_count(std::uint64_t n, std::uint64_t k) {
    GRADZIP_EXPECTS(k <= n, "count_sketch::unsketch: k = ", k, " exceeds n = ", n);
  }

  /// Bytes `unsketch` may write for k of n elements (a codec<sparsify::topk> payload).
  std::size_t max_unsketch_bytes(std::size_t n, std::uint64_t k) const {
    return codec<sparsify::topk>{sparsify::topk::count(k)}.max_compressed_bytes<float>(n);
  }

  /// The k heavy hitters of a sketch of n elements: the k largest |estimates| (top-k's rules) as
  /// a codec<sparsify::topk> payload of estimated values; returns its size. Scratch: n floats in
  /// `exec`. n is the caller's, never the payload's: a payload of another n is rejected
  /// (size_mismatch) before anything is allocated, so hostile bytes cannot choose the size.
  std::size_t unsketch(host& exec, span<const std::byte> sketch, std::uint64_t n, std::uint64_t k,
                       span<std::byte> out) const {
    expect_unsketch_size(n);
    expect_unsketch_count(n, k);
    parse(sketch, &n);
    const codec<sparsify::topk> top{sparsify::topk::count(k)};
    // Scratch: top-k's own, then the n estimates (sized together: growing discards contents).
    const std::size_t at = gradzip::detail::scratch_aligned(top.workspace_bytes<float>(exec, n));
    auto* estimates = reinterpret_cast<float*>(exec.scratch(at + n * sizeof(float)) + at);
    estimate(exec, sketch, span<float>(estimates, n));
    return top.compress(exec, span<const float>(estimates, n), out);
  }

  /// Median of r values (the mean of the two middle ones for even r); sorts v. An odd-even
  /// transposition network of branch-free compare-exchanges, shared by every executor: a
  /// branchy sort mispredicts on every other comparison (an insertion sort made `estimate` cost
  /// 53 ns per element at r = 5), and the fixed sequence of selects gives the same result on
  /// the host, its vector lanes and the device.
  ///
  /// NaN rows (poisoned cells: a non-finite element hashed there) are left out: the median is
  /// that of the other rows, and NaN only when every row is. The non-finite element's own
  /// estimate is NaN (all of its cells are poisoned), and an element that merely shares one
  /// cell with it keeps an estimate from its other rows. (The network used to leave a NaN where
  /// it was, so whether such an element's estimate was NaN depended on the row.)
  GRADZIP_HOST_DEVICE static float median(float* v, std::uint32_t r) {
    const std::uint32_t m = numbers_last_nan(v, r);
    transposition_sort<1>(v, r);
    return median_of_sorted(v, m);
  }
  /// v[j stride] <- +inf where it is NaN, for j < r, so that the network sorts those rows last
  /// (the m smallest values are then exactly the m numbers, a real inf or not); returns m.
  GRADZIP_HOST_DEVICE static std::uint32_t numbers_last_nan(float* v, std::uint32_t r, std::uint64_t stride = 1) {
    std::uint32_t m = 0;
    for (std::uint32_t j = 0; j < r; ++j) {
      const bool number = v[j * stride] == v[j * stride];
      m += number ? 1u : 0u;
      v[j * stride] = number ? v[j * stride] : gradzip::detail::bit_cast<float>(0x7F800000u);
    }
    return m;
  }
  /// Sorts each of the `Lanes` columns of v (r rows x Lanes, row-major) by the same network of
  /// compare-exchanges: the host runs 8 lanes at once, the device and the tail one.
  template <int Lanes>
  GRADZIP_HOST_DEVICE static void transposition_sort(float* v, std::uint32_t r) {
    for (std::uint32_t pass = 0; pass < r; ++pass) {
      for (std::uint32_t j = pass & 1; j + 1 < r; j += 2) {
        for (int l = 0; l < Lanes; ++l) compare_exchange(v[j * Lanes + l], v[(j + 1) * Lanes + l]);
      }
    }
  }
  /// (a, b) <- (min, max) by one comparison (numbers_last_nan has replaced the NaNs).
  GRADZIP_HOST_DEVICE static void compare_exchange(float& a, float& b) {
    const bool swap = b < a;
    const float low = swap ? b : a, high = swap ? a : b;
    a = low;
    b = high;
  }
  /// The median of the m smallest of sorted values v[0], v[stride], ... (the numbers, NaN rows
  /// sorted after them); poisoned_cell when m is 0.
  GRADZIP_HOST_DEVICE static float median_of_sorted(const float* v, std::uint32_t m, std::uint64_t stride = 1) {
    if (m == 0) return gradzip::detail::bit_cast<float>(std::uint32_t{poisoned_cell});
    if (m % 2 == 1) return v[m / 2 * stride];
    return mean_of_two(v[(m / 2 - 1) * stride], v[m / 2 * stride]);
  }
  /// (a + b) / 2 without overflow: 0.5 (a + b), which equals 0.5 a + 0.5 b whenever a + b is
  /// finite and normal; halved first where a + b overflows (two cells near 3e38: it was inf).
  /// Each product and sum rounded once (mul_rn, add_rn: nvcc would fuse them otherwise).
  GRADZIP_HOST_DEVICE static float mean_of_two(float a, float b) {
    using gradzip::detail::add_rn;
    using gradzip::detail::mul_rn;
    const float sum = add_rn(a, b);
    return gradzip::is_finite(sum) ? mul_rn(0.5f, sum) : canonical(add_rn(mul_rn(0.5f, a), mul_rn(0.5f, b)));
  }

 private:
  struct view {
    const std::uint8_t* table = nullptr;
    std::uint64_t n = 0;
  };

  /// Validates a sketch payload of this configuration (and of n elements, if given).
  view parse(span<const std::byte> bytes, const std::uint64_t* n) const {
    const wire::header h = wire::read_header(bytes, "count_sketch");
    const auto* base = reinterpret_cast<const std::uint8_t*>(bytes.data());
    std::uint64_t table = 0;
    wire::throw_if_failed(check_frame(h, base, n, rows_, columns_, seed_, table), "count_sketch");
    return {base + table, h.element_count};
  }

  /// The largest finite |value| (its bits) and the number of non-finite values.
  struct magnitude {
    std::uint32_t max_bits = 0;
    std::uint64_t non_finite = 0;
  };
  template <class T>
  static magnitude magnitude_of(host& exec, span<const T> x) {
    constexpr std::size_t max_chunks = 64;  // per-chunk results on the stack
    const std::size_t chunks = std::min(max_chunks, gradzip::detail::chunk_count(exec, x.size()));
    magnitude parts[max_chunks];
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(x.size(), chunks, c);
      parts[c] = magnitude_range(x.data(), r.begin, r.end);
    });
    magnitude m;
    for (std::size_t c = 0; c < chunks; ++c) {
      m.max_bits = std::max(m.max_bits, parts[c].max_bits);
      m.non_finite += parts[c].non_finite;
    }
    return m;
  }

  template <class T>
  static magnitude magnitude_range(const T* data, std::uint64_t begin, std::uint64_t end) {
    magnitude m;
    std::uint64_t i = begin;
#if defined(__AVX2__)
    if constexpr (std::is_same_v<T, float>) {
      // Non-negative int32 lanes: |bits| of a finite value is below non_finite_bits.
      const __m256i magnitude_bits = _mm256_set1_epi32(0x7FFFFFFF);
      const __m256i largest_finite = _mm256_set1_epi32(static_cast<int>(gradzip::detail::fixed_point::non_finite_bits) - 1);
      __m256i max_bits = _mm256_setzero_si256(), bad_count = _mm256_setzero_si256();
      // Each lane counts at most 2^31 - 1 non-finite values before it is added to the total.
      const std::uint64_t block = std::uint64_t{lanes} << 30;
      while (i + lanes <= end) {
        const std::uint64_t stop = i + std::min(block, (end - i) / lanes * lanes);
        for (; i < stop; i += lanes) {
          const __m256i a = _mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)), magnitude_bits);
          const __m256i bad = _mm256_cmpgt_epi32(a, largest_finite);
          max_bits = _mm256_max_epi32(max_bits, _mm256_andnot_si256(bad, a));
          bad_count = _mm256_sub_epi32(bad_count, bad);
        }
        alignas(32) std::int32_t lane_max[lanes], lane_bad[lanes];
        _mm256_store_si256(reinterpret_cast<__m256i*>(lane_max), max_bits);
        _mm256_store_si256(reinterpret_cast<__m256i*>(lane_bad), bad_count);
        for (int l = 0; l < lanes; ++l) {
          m.max_bits = std::max(m.max_bits, static_cast<std::uint32_t>(lane_max[l]));
          m.non_finite += static_cast<std::uint64_t>(lane_bad[l]);
        }
        bad_count = _mm256_setzero_si256();
      }
    }
#endif
    for (; i < end; ++i) {
      const float v = value_of(data[i]);
      m.max_bits = std::max(m.max_bits, gradzip::detail::fixed_point::finite_magnitude(v));
      m.non_finite += gradzip::is_finite(v) ? 0u : 1u;
    }
    return m;
  }

  /// The 2 x rows half-rows in parallel, each into its own 64-bit row in scratch, then each
  /// cell's two halves added and rounded to fp32. Half-rows rather than rows, so that 2 threads
  /// share the work evenly for any number of rows (FetchSGD's 5 rows as whole rows split 3 + 2).
  template <class T>
  void sketch_rows(host& exec, span<const T> x, const gradzip::detail::fixed_point& fp, std::uint8_t* table) const {
    const std::uint64_t n = x.size(), middle = n / 2;
    const std::size_t units = 2 * static_cast<std::size_t>(rows_);  // unit u: row u / 2, half u % 2
    auto* halves = reinterpret_cast<std::int64_t*>(exec.scratch(units * columns_ * sizeof(std::int64_t)));
    const int threads = std::max(1, std::min(exec.threads(), static_cast<int>(units)));
    gradzip::detail::for_each_chunk(exec, static_cast<std::size_t>(threads), [&](std::size_t t) {
      for (std::size_t u = t; u < units; u += static_cast<std::size_t>(threads)) {
        std::int64_t* cells = halves + u * columns_;
        std::fill(cells, cells + columns_, std::int64_t{0});
        const multiply_shift f = row_hash(seed_, static_cast<std::uint32_t>(u / 2));
        const std::uint64_t begin = u % 2 == 0 ? 0 : middle, end = u % 2 == 0 ? middle : n;
        for_each_high_half(begin, end, [&](std::uint64_t b, std::uint64_t e) { add_range(x.data(), f, fp, b, e, cells); });
      }
    });
    const std::uint64_t cells = static_cast<std::uint64_t>(rows_) * columns_;
    const std::size_t chunks = gradzip::detail::chunk_count(exec, cells);
    gradzip::detail::for_each_chunk(exec, chunks, [&](std::size_t c) {
      const auto r = gradzip::detail::chunk_of(cells, chunks, c);
      for (std::uint64_t j = r.begin; j < r.end; ++j) {
        const std::uint64_t row = j / columns_, column = j % columns_;
        store_cell(table, j, fp.to_float(halves[2 * row * columns_ + column] + halves[(2 * row + 1) * columns_ + column]));
      }
    });
  }

  /// Every cell that a non-finite element maps to becomes poisoned_cell (rare: one more pass).
  template <class T>
  void poison_cells(span<const T> x, std::uint8_t* table) const {
    const float nan = gradzip::detail::bit_cast<float>(std::uint32_t{poisoned_cell});
    for (std::uint32_t row = 0; row < rows_; ++row) {
      for (std::uint64_t i = 0; i < x.size(); ++i) {
        if (!gradzip::is_finite(value_of(x[i]))) store_cell(table, cell_of(row, i), nan);
      }
    }
  }

  /// Elements hashed (and estimated) together.
  static constexpr int lanes = 8;

  /// Calls body(begin', end') on the parts of [begin, end) whose indices share their high 32-bit
  /// half (multiply_shift's constant a1 hi + b): all of it below 2^32.
  template <class Body>
  static void for_each_high_half(std::uint64_t begin, std::uint64_t end, Body&& body) {
    while (begin < end) {
      const std::uint64_t part_end = std::min(end, (begin | 0xFFFFFFFFu) + 1);
      body(begin, part_end);
      begin = part_end;
    }
  }

#if defined(__AVX2__)
  /// value_of of eight elements, in registers (a copy through a stack array costs a failed
  /// store-to-load forwarding per step: two 16-byte stores read back as one 32-byte load).
  template <class T>
  static __m256 load_8(const T* data) {
    if constexpr (std::is_same_v<T, float>) {
      return _mm256_loadu_ps(data);
    } else {
      return _mm256_setr_ps(value_of(data[0]), value_of(data[1]), value_of(data[2]), value_of(data[3]),
                            value_of(data[4]), value_of(data[5]), value_of(data[6]), value_of(data[7]));
    }
  }
#endif

  /// cells[h(i)] += s(i) q_i for i in [begin, end) of one row (hashed and converted eight
  /// indices per step under AVX2: the same buckets, signs and fixed points). A non-finite value
  /// adds 0 here; poison_cells marks its cells.
  template <class T>
  void add_range(const T* data, const multiply_shift& f, const gradzip::detail::fixed_point& fp, std::uint64_t begin,
                 std::uint64_t end, std::int64_t* cells) const {
    std::uint64_t i = begin;
#if defined(__AVX2__)
    const gradzip::detail::multiply_shift_avx2 hasher(f, begin >> 32, columns_);
    __m256i low = hasher.lanes_from(static_cast<std::uint32_t>(begin));
    alignas(32) std::uint32_t hashes[lanes], buckets[lanes];
    alignas(32) std::int32_t fixed[lanes];
    // 1 / unit as a float when it is one (largest magnitude >= 2^-97 at 30 bits): v / unit is
    // then exact in float too (at most 2^31 - 2^7, or below 2^-126 where q is 0 either way), and
    // vcvtps2dq rounds it half to even like the scalar path. Otherwise the scalar path runs.
    const bool float_scale = fp.unit_exponent >= -127;
    const __m256 inverse_unit = _mm256_set1_ps(float_scale ? static_cast<float>(fp.inverse_unit()) : 0.0f);
    const __m256i magnitude_bits = _mm256_set1_epi32(0x7FFFFFFF);
    const __m256i largest_finite = _mm256_set1_epi32(static_cast<int>(gradzip::detail::fixed_point::non_finite_bits) - 1);
    for (; float_scale && i + lanes <= end; i += lanes) {
      low = hasher.hash_8(low, hashes, buckets);
      // Zero the non-finite lanes, q = round_half_even(v / unit), then the hash's sign:
      // (q ^ s) - s with s = 0 or -1.
      const __m256 v = load_8(data + i);
      const __m256i bad = _mm256_cmpgt_epi32(_mm256_and_si256(_mm256_castps_si256(v), magnitude_bits), largest_finite);
      const __m256i q = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_andnot_ps(_mm256_castsi256_ps(bad), v), inverse_unit));
      const __m256i s = _mm256_srai_epi32(_mm256_load_si256(reinterpret_cast<const __m256i*>(hashes)), 31);
      _mm256_store_si256(reinterpret_cast<__m256i*>(fixed), _mm256_sub_epi32(_mm256_xor_si256(q, s), s));
      for (int l = 0; l < lanes; ++l) cells[buckets[l]] += fixed[l];
    }
#endif
    for (; i < end; ++i) {
      const std::uint32_t h = f(i);
      const float v = value_of(data[i]);
      if (gradzip::is_finite(v)) cells[bucket_of(h, columns_)] += signed_fixed(fp, v, h);
    }
  }

  /// out[i] <- the median estimate of element i for i in [begin, end), one high half. A tile
  /// of elements at a time, row by row: each row's cells are read while that row alone is in
  /// cache (five rows of n/500 columns at 2^24 are 670 KB, more than a core's L2), and the
  /// rows' values sit side by side for the median's network to run across the tile's lanes.
  /// `poisoned`: whether the table holds a NaN cell (else the NaN rows' pass is skipped).
  template <class T>
  void estimate_range(const std::uint8_t* table, const multiply_shift* f, std::uint64_t begin, std::uint64_t end,
                      T* out, bool poisoned) const {
    alignas(32) float values[max_rows][tile];
    for (std::uint64_t i = begin; i < end; i += tile) {
      const std::uint64_t m = std::min<std::uint64_t>(tile, end - i);
      for (std::uint32_t row = 0; row < rows_; ++row) gather_row(row_cells(table, row), f[row], i, m, values[row]);
      if (!poisoned) {  // no NaN cell in the table: every lane's median at the same row
        transposition_sort<tile>(&values[0][0], rows_);
        for (std::uint64_t l = 0; l < m; ++l) out[i + l] = from_double<T>(median_of_sorted(&values[0][l], rows_, tile));
        continue;
      }
      // numbers_last_nan across the tile's lanes, row by row (vector instructions).
      alignas(32) std::uint32_t numbers[tile];
      for (std::uint64_t l = 0; l < tile; ++l) numbers[l] = rows_;
      for (std::uint32_t row = 0; row < rows_; ++row) {
        float* v = values[row];
        for (std::uint64_t l = 0; l < tile; ++l) {
          const bool number = v[l] == v[l];
          numbers[l] -= number ? 0u : 1u;
          v[l] = number ? v[l] : gradzip::detail::bit_cast<float>(0x7F800000u);
        }
      }
      transposition_sort<tile>(&values[0][0], rows_);
      for (std::uint64_t l = 0; l < m; ++l) out[i + l] = from_double<T>(median_of_sorted(&values[0][l], numbers[l], tile));
    }
  }

  /// Elements estimated together: a tile of values is max_rows x tile floats on the stack.
  static constexpr std::uint64_t tile = 512;

  /// v[l] <- s(i + l) cells[h(i + l)] for l < m, zero for the rest of the tile; i .. i + m share
  /// their high half.
  void gather_row(const std::uint8_t* cells, const multiply_shift& f, std::uint64_t i, std::uint64_t m, float* v) const {
    std::uint64_t l = 0;
#if defined(__AVX2__)
    const gradzip::detail::multiply_shift_avx2 hasher(f, i >> 32, columns_);
    __m256i low = hasher.lanes_from(static_cast<std::uint32_t>(i));
    alignas(32) std::uint32_t hashes[lanes], buckets[lanes];
    for (; l + lanes <= m; l += lanes) {
      low = hasher.hash_8(low, hashes, buckets);
      for (int k = 0; k < lanes; ++k) v[l + k] = apply_sign(load_cell(cells, buckets[k]), hashes[k]);
    }
#endif
    for (; l < m; ++l) {
      const std::uint32_t h = f(i + l);
      v[l] = apply_sign(load_cell(cells, bucket_of(h, columns_)), h);
    }
    std::fill(v + m, v + tile, 0.0f);
  }

  /// Whether any cell is NaN (rows x columns cells: about 1 % of n reads at n / 500 columns).
  bool has_nan_cell(const std::uint8_t* table) const {
    const std::uint64_t cells = static_cast<std::uint64_t>(rows_) * columns_;
    std::uint32_t nan = 0;
    for (std::uint64_t j = 0; j < cells; ++j) {
      const float v = load_cell(table, j);
      nan |= v == v ? 0u : 1u;
    }
    return nan != 0;
  }

  const std::uint8_t* row_cells(const std::uint8_t* table, std::uint32_t row) const {
    return table + static_cast<std::uint64_t>(row) * columns_ * sizeof(float);
  }

  std::uint32_t rows_;
  std::uint64_t columns_;
  std::uint64_t seed_;
};

}  // namespace gradzip::sketch
