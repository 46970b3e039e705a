/**
 * @file stage.hpp
 * @brief The interfaces of the three stages of `codec<Structure, Values, Indices>`, stated once
 * and checked: a stage that lacks a member fails to compile with a message naming it.
 *
 * `codec` checks its stages with `stage::check_structure<S>()`, `stage::check_values<V>()` and
 * `stage::check_indices<I>()`; call them yourself next to a stage you write (docs/extending.md)
 * to see the message there. tests/compile_fail/stage_members.cpp checks that the message names
 * the missing member.
 *
 * **Values stage, element-wise** (`quantize::none`, the casts): each chosen value is stored on
 * its own; `pos` is the value's position in the payload's values section.
 *
 *     static constexpr std::uint8_t id;             // wire id (built-ins < 128; yours 128..255)
 *     static constexpr bool summable;               // payloads of several workers may be summed
 *     static constexpr std::uint64_t param_bytes;   // a multiple of 8
 *     static void write_params(std::uint8_t* p);
 *     static wire::status check_params(const std::uint8_t* p, std::uint64_t at);
 *     static std::uint64_t value_size(element_type input);          // bytes per value
 *     static void store(std::uint8_t* section, std::uint64_t pos, T value);   // for every T
 *     static double load(const std::uint8_t* section, element_type input, std::uint64_t pos);
 *
 * Optional: `static constexpr std::optional<element_type> summed_as(element_type input)`, the
 * element type of the values section when it is an array a communicator can sum (f32, f64,
 * f16, bf16); `comm::allreducer` then sums payloads of a `summable` codec with one
 * `allreduce_sum` instead of gathering them. An element-wise stage may also be stochastic:
 * `static constexpr bool stochastic = true`, a `std::uint64_t seed` member, and a non-static
 * `store(section, pos, value, random)` that gets the element's random word (as below).
 *
 * **Values stage, bucketed** (uniform, QSGD, TernGrad, sign, ...): values are coded in buckets of
 * `bucket` elements, each with a record (its scale) that needs all of the bucket's values
 * first. Derive from `quantize::bucketed_stage<Bits, Bucket, Record>` (sizes, code packing and
 * record storage), and add `id`, `summable`, `param_bytes`, `write_params`, `check_params` as
 * above, and:
 *
 *     static quantize::bucket_stats empty_stats();                  // the identity of merge
 *     static void add(quantize::bucket_stats& s, float v);          // one value into s
 *     static quantize::bucket_stats merge(bucket_stats a, bucket_stats b);  // commutative, exact
 *     static record make_record(quantize::bucket_stats s, std::uint64_t count);
 *     unsigned encode(float v, const record& r, std::uint32_t random) const;  // code <= max_code
 *     static float decode(unsigned code, const record& r);
 *
 * `random` is 0 unless the stage sets `static constexpr bool stochastic = true` and has a
 * `std::uint64_t seed` member: element i of a tensor then gets 16 Philox bits keyed by the seed
 * and `compress_context` (`random_half_word`), in the word's top half; its low half is 0, so
 * `uniform_float(random)` is a multiple of 2^-16. A stage whose codes do not fill all 2^Bits values sets
 * `codes_need_check = true` and `max_code`: decoding then rejects larger codes.
 *
 * **Structure stage** (`sparsify::none`, `topk`, ...): which elements are sent.
 *
 *     static constexpr std::uint8_t id;
 *     static constexpr bool summable;            // same indices on every worker (none, random-k)
 *     static constexpr bool explicit_indices;    // indices go on the wire (an indices stage)
 *     std::uint64_t selected_count(std::uint64_t n) const;   // k, or a bound on it
 *
 * Optional: `static constexpr bool data_dependent_count = true` when k depends on the data
 * (then selected_count(n) is a bound). A stage written outside the library runs on the host
 * executor through two members of its own, on one thread:
 *
 *     template <class T> std::uint64_t count(span<const T> x) const;   // data-dependent only
 *     template <class T, class Sink>
 *     void select(span<const T> x, std::uint64_t k, const Sink& sink) const;
 *
 * `select` calls `sink(pos, index, x[index])` exactly k times (k = selected_count(n), or what
 * `count` returned), with pos = 0, 1, ..., k - 1 and indices strictly increasing. The built-in
 * stages have host and CUDA backends of their own; a user structure stage has no CUDA path yet
 * (docs/extending.md).
 *
 * **Indices stage** (`encode::none`, `coo`, `bitmap`, `delta_varint`, `automatic`): how
 * explicit indices are written. The executors write and read each built-in one with code of
 * their own, so this is not an extension point yet; its common members:
 *
 *     static constexpr std::uint8_t id;          // 0: none (for structures without indices)
 *     static constexpr std::uint64_t param_bytes;
 *     static constexpr bool staged;              // false: stored as selected (COO)
 *     static wire::status check_params(const std::uint8_t* p, std::uint64_t n, std::uint64_t at);
 */
#pragma once

#include <cstdint>
#include <optional>
#include <type_traits>
#include <utility>

#include "gradzip/core/element_type.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::stage {

/// The first wire id of a values or structure stage written outside the library: built-in
/// stages use ids below it, and will keep doing so; ids 128..255 are yours.
inline constexpr std::uint8_t first_user_id = 128;

namespace detail {

template <class, template <class> class, class = void>
struct detects : std::false_type {};
template <class S, template <class> class Member>
struct detects<S, Member, std::void_t<Member<S>>> : std::true_type {};

template <class S> using id_t = decltype(S::id);
template <class S> using summable_t = decltype(S::summable);
template <class S> using param_bytes_t = decltype(S::param_bytes);
template <class S> using explicit_indices_t = decltype(S::explicit_indices);
template <class S> using staged_t = decltype(S::staged);
template <class S> using selected_count_t = decltype(std::declval<const S&>().selected_count(std::uint64_t{}));
template <class S> using write_params_t = decltype(S::write_params(std::declval<std::uint8_t*>()));
template <class S>
using check_params_t = decltype(S::check_params(std::declval<const std::uint8_t*>(), std::uint64_t{}));
template <class S>
using indices_check_params_t =
    decltype(S::check_params(std::declval<const std::uint8_t*>(), std::uint64_t{}, std::uint64_t{}));
template <class S> using value_size_t = decltype(S::value_size(element_type::f32));
template <class S> using store_t = decltype(S::store(std::declval<std::uint8_t*>(), std::uint64_t{}, 1.0f));
template <class S>
using load_t = decltype(S::load(std::declval<const std::uint8_t*>(), element_type::f32, std::uint64_t{}));
template <class S> using empty_stats_t = decltype(S::empty_stats());
template <class S>
using add_t = decltype(S::add(std::declval<quantize::bucket_stats&>(), 1.0f));
template <class S>
using merge_t = decltype(S::merge(std::declval<quantize::bucket_stats>(), std::declval<quantize::bucket_stats>()));
template <class S>
using make_record_t = decltype(S::make_record(std::declval<quantize::bucket_stats>(), std::uint64_t{}));
template <class S>
using encode_t = decltype(std::declval<const S&>().encode(1.0f, std::declval<const typename S::record&>(),
                                                          std::uint32_t{}));
template <class S>
using decode_t = decltype(S::decode(0u, std::declval<const typename S::record&>()));
template <class S> using seed_t = decltype(std::declval<const S&>().seed);
template <class S>
using random_store_t = decltype(std::declval<const S&>().store(std::declval<std::uint8_t*>(), std::uint64_t{}, 1.0f,
                                                               std::uint32_t{}));

/// An optional `static constexpr bool` member, read through `Flag<S>` (std::bool_constant of
/// it): its value, or false when S does not declare it.
template <class S, template <class> class Flag, class = void>
struct optional_flag : std::false_type {};
template <class S, template <class> class Flag>
struct optional_flag<S, Flag, std::void_t<Flag<S>>> : Flag<S> {};

template <class S> using bucketed_flag = std::bool_constant<S::bucketed>;
template <class S> using stochastic_flag = std::bool_constant<S::stochastic>;
template <class S> using implicit_indices_flag = std::bool_constant<S::implicit_indices>;
template <class S> using data_dependent_count_flag = std::bool_constant<S::data_dependent_count>;
template <class S> using codes_need_check_flag = std::bool_constant<S::codes_need_check>;

/// The members every values and structure stage declares.
template <class S>
constexpr bool check_common() {
  static_assert(detects<S, id_t>::value, "stage lacks `static constexpr std::uint8_t id` (its wire id)");
  static_assert(detects<S, summable_t>::value,
                "stage lacks `static constexpr bool summable` (whether payloads of several workers may be summed)");
  static_assert(std::is_trivially_copyable_v<S>, "stage must be a trivially copyable value type");
  return true;
}

template <class V>
constexpr bool check_params_members() {
  static_assert(detects<V, param_bytes_t>::value, "values stage lacks `static constexpr std::uint64_t param_bytes`");
  static_assert(detects<V, write_params_t>::value, "values stage lacks `static void write_params(std::uint8_t* p)`");
  static_assert(detects<V, check_params_t>::value,
                "values stage lacks `static wire::status check_params(const std::uint8_t* p, std::uint64_t at)`");
  return true;
}

template <class V>
constexpr bool check_element_wise() {
  constexpr bool random = optional_flag<V, stochastic_flag>::value;
  static_assert(detects<V, value_size_t>::value,
                "values stage lacks `static std::uint64_t value_size(element_type input)` (or is it bucketed? "
                "then derive from quantize::bucketed_stage)");
  static_assert(random || detects<V, store_t>::value,
                "values stage lacks `template <class T> static void store(std::uint8_t* section, std::uint64_t "
                "pos, T value)`");
  static_assert(!random || detects<V, random_store_t>::value,
                "stochastic values stage lacks `template <class T> void store(std::uint8_t* section, std::uint64_t "
                "pos, T value, std::uint32_t random) const`");
  static_assert(detects<V, load_t>::value,
                "values stage lacks `static double load(const std::uint8_t* section, element_type input, "
                "std::uint64_t pos)`");
  return true;
}

template <class V>
constexpr bool check_bucketed() {
  static_assert(detects<V, empty_stats_t>::value, "bucketed values stage lacks `static bucket_stats empty_stats()`");
  static_assert(detects<V, add_t>::value, "bucketed values stage lacks `static void add(bucket_stats& s, float v)`");
  static_assert(detects<V, merge_t>::value,
                "bucketed values stage lacks `static bucket_stats merge(bucket_stats a, bucket_stats b)`");
  static_assert(detects<V, make_record_t>::value,
                "bucketed values stage lacks `static record make_record(bucket_stats s, std::uint64_t count)`");
  static_assert(detects<V, encode_t>::value,
                "bucketed values stage lacks `unsigned encode(float v, const record& r, std::uint32_t random) const`");
  static_assert(detects<V, decode_t>::value,
                "bucketed values stage lacks `static float decode(unsigned code, const record& r)`");
  return true;
}

template <class S> using summed_as_t = decltype(S::summed_as(element_type::f32));

}  // namespace detail

/// Whether a values stage draws random words (its `stochastic` member; false when absent). A
/// variable, not a function, so device code may read it.
template <class V>
inline constexpr bool is_stochastic = detail::optional_flag<V, detail::stochastic_flag>::value;

/// The element type a communicator sums a values stage's section as, for input type `input`;
/// empty when the stage declares none (its payloads are then gathered).
template <class V>
constexpr std::optional<element_type> summed_as(element_type input) {
  if constexpr (detail::detects<V, detail::summed_as_t>::value) {
    return V::summed_as(input);
  } else {
    return std::nullopt;
  }
}

/// Checks a values stage: element-wise, or bucketed when it derives from bucketed_stage.
template <class V>
constexpr bool check_values() {
  detail::check_common<V>();
  detail::check_params_members<V>();
  static_assert(!is_stochastic<V> || detail::detects<V, detail::seed_t>::value,
                "stochastic values stage lacks a `std::uint64_t seed` member (the key of its random words)");
  if constexpr (detail::optional_flag<V, detail::bucketed_flag>::value) {
    return detail::check_bucketed<V>();
  } else {
    return detail::check_element_wise<V>();
  }
}

/// Checks a structure stage's members (its executor backend is checked where it is called).
template <class S>
constexpr bool check_structure() {
  detail::check_common<S>();
  static_assert(detail::detects<S, detail::explicit_indices_t>::value,
                "structure stage lacks `static constexpr bool explicit_indices` (whether indices go on the wire)");
  static_assert(detail::detects<S, detail::selected_count_t>::value,
                "structure stage lacks `std::uint64_t selected_count(std::uint64_t n) const`");
  return true;
}

/// Checks an indices stage.
template <class I>
constexpr bool check_indices() {
  static_assert(detail::detects<I, detail::id_t>::value, "indices stage lacks `static constexpr std::uint8_t id`");
  static_assert(detail::detects<I, detail::param_bytes_t>::value,
                "indices stage lacks `static constexpr std::uint64_t param_bytes`");
  static_assert(detail::detects<I, detail::staged_t>::value,
                "indices stage lacks `static constexpr bool staged` (false when indices are stored as selected)");
  static_assert(detail::detects<I, detail::indices_check_params_t>::value,
                "indices stage lacks `static wire::status check_params(const std::uint8_t* p, std::uint64_t n, "
                "std::uint64_t at)`");
  return true;
}

}  // namespace gradzip::stage
