/**
 * @file dense_state.hpp
 * @brief Saving and restoring a stateful wrapper's dense buffer (a residual, a momentum) as a
 * gradzip payload with codec id 0, for checkpoints.
 *
 * The payload is a header and one values section holding the buffer's n elements of T as they
 * are. `restore_dense_state` validates it fully (header, sections, codec id, element type, count,
 * section size) before it touches the buffer. Both are synchronous.
 */
#pragma once

#include <cstring>
#include <utility>
#include <vector>

#include "gradzip/core/executor.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"

namespace gradzip::feedback::detail {

/// A stateful wrapper's output must hold the codec's bound, checked before the state changes:
/// a retry after the error must not count the gradient twice.
inline void expect_output(span<std::byte> out, std::size_t bound, const char* what) {
  GRADZIP_EXPECTS(out.size() >= bound, what, ": the output buffer holds ", out.size(), " bytes, the bound is ",
                  bound, " (nothing has changed)");
}

template <class T, class Exec, class Buffer>
std::vector<std::byte> save_dense_state(Exec& exec, const Buffer& state, std::size_t n) {
  wire::payload_layout l;
  l.add(wire::tag::values, n * sizeof(T));
  std::vector<std::byte> bytes(l.total_bytes());
  auto* base = reinterpret_cast<std::uint8_t*>(bytes.data());
  wire::write_header(base, l, element_traits<T>::type, wire::codec_id{}, n);
  wire::zero_section_padding(base, l);
  gradzip::detail::executor_ops<Exec>::copy_to_host(exec, state, reinterpret_cast<T*>(base + l.at(0).offset));
  return bytes;
}

/// Two states back to back, as split_dense_states reads them.
template <class T, class Exec, class Buffer>
std::vector<std::byte> save_dense_states(Exec& exec, const Buffer& a, const Buffer& b, std::size_t n) {
  std::vector<std::byte> bytes = save_dense_state<T>(exec, a, n);
  const std::vector<std::byte> second = save_dense_state<T>(exec, b, n);
  bytes.insert(bytes.end(), second.begin(), second.end());
  return bytes;
}

/// Validates a saved state of n elements of T, all of `bytes` (another state after it, such as
/// the second of EF21's two, is not this one's), and returns its header; `what` names the caller
/// in error messages ("error_feedback::restore").
template <class T>
wire::header check_dense_state(span<const std::byte> bytes, std::size_t n, const char* what) {
  const wire::header h = wire::read_header(bytes, what);
  wire::expect_whole(h, bytes, what);
  const wire::tag tags[1] = {wire::tag::values};
  wire::throw_if_failed(wire::expect_sections(h, tags, 1), what);
  if (h.codec.packed() != 0) {
    wire::throw_if_failed(wire::fail(wire::format_errc::codec_mismatch, h.codec.packed(), 0), what);
  }
  if (h.type != element_traits<T>::type) {  // bytes, not a parameter: a format_error
    wire::throw_if_failed(wire::fail(wire::format_errc::element_type_mismatch, static_cast<std::uint64_t>(h.type),
                                     static_cast<std::uint64_t>(element_traits<T>::type)),
                          what);
  }
  if (h.element_count != n) {
    wire::throw_if_failed(wire::fail(wire::format_errc::size_mismatch, h.element_count, n), what);
  }
  if (h.sections[0].size != n * sizeof(T)) {
    wire::throw_if_failed(
        wire::fail(wire::format_errc::bad_section_size, 0, h.sections[0].size, n * sizeof(T)), what);
  }
  return h;
}

template <class T, class Exec, class Buffer>
void restore_dense_state(Exec& exec, span<const std::byte> bytes, Buffer& state, std::size_t n,
                         const char* what) {
  const wire::header h = check_dense_state<T>(bytes, n, what);
  std::vector<T> staged(n);
  const auto& values = h.sections[0];  // validated: inside `bytes`, exactly n elements
  if (values.size != 0) std::memcpy(staged.data(), bytes.data() + values.offset, values.size);
  gradzip::detail::executor_ops<Exec>::copy_from_host(exec, staged.data(), state);
}

/// Two saved states back to back (momentum correction's u and v, EF21's g_i and g): both
/// validated, and nothing after the second, before the caller restores either.
template <class T>
std::pair<span<const std::byte>, span<const std::byte>> split_dense_states(span<const std::byte> bytes, std::size_t n,
                                                                           const char* what) {
  const wire::header first = wire::read_header(bytes, what);
  const span<const std::byte> a = bytes.subspan(0, first.total_bytes);
  const span<const std::byte> b = bytes.subspan(first.total_bytes, bytes.size() - first.total_bytes);
  check_dense_state<T>(a, n, what);
  check_dense_state<T>(b, n, what);  // and nothing after it
  return {a, b};
}

}  // namespace gradzip::feedback::detail
