// The pieces codec<Structure, Values, Indices> is built from, apart from its stages: what a
// parsed payload holds (payload_view), the traits the codec reads off its stages, the sinks a
// selection writes through, and the executor backends' declarations (specialized in
// detail/host/ and detail/cuda/).
#pragma once

#include <cstddef>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "gradzip/core/element_type.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/quantize/bucket_stats.hpp"
#include "gradzip/stage.hpp"
#include "gradzip/wire/format.hpp"

namespace gradzip::detail {

/// What a validated payload holds: its count and where its indices (if any) and values are.
struct payload_view {
  wire::header header;
  std::uint64_t count = 0;  // elements sent: k for a sparsifier, n for a dense structure
  int index_width = 0;      // COO's index width or delta-varint's gap width (encode::width_of)
  std::uint8_t index_encoding = 0;  // concrete encoding: encode::coo/bitmap/delta_varint::id, 0 for none
  std::uint64_t index_bytes = 0;    // size of the indices section
  const std::uint8_t* structure_params = nullptr;  // implicit-index structures (random-k)
  const std::uint8_t* indices = nullptr;
  const std::uint8_t* scales = nullptr;  // bucketed values stages only
  const std::uint8_t* values = nullptr;
};

/// Structures whose indices are recomputed from their parameters (random-k) set
/// `implicit_indices`; they also have `param_bytes` of parameters in the payload.
template <class Structure>
using has_implicit_indices = stage::detail::optional_flag<Structure, stage::detail::implicit_indices_flag>;

template <class Structure>
constexpr std::uint64_t structure_param_bytes() {
  if constexpr (has_implicit_indices<Structure>::value) {
    return Structure::param_bytes;
  } else {
    return 0;
  }
}

/// What compress decides on the host before the frame is written, passed by value to the
/// device: the structure stage's parameter bytes (random-k) and the concrete index encoding
/// (encode::automatic's choice).
struct frame_params {
  std::uint8_t structure[24] = {};
  std::uint8_t index_encoding = 0;
};

/// implicit_backend<Exec>: runs an implicit-index structure's selection on an executor.
template <class Exec>
struct implicit_backend;

/// async_compress_backend<Exec>: codec::compress_async (host below; CUDA in
/// detail/cuda/compress_async.cuh).
template <class Exec>
struct async_compress_backend;

/// Structures whose selected count depends on the data (threshold) set `data_dependent_count`:
/// the codec asks their backend to `count` before it lays out the payload.
template <class Structure>
using has_data_dependent_count = stage::detail::optional_flag<Structure, stage::detail::data_dependent_count_flag>;

template <class Values>
using is_bucketed = stage::detail::optional_flag<Values, stage::detail::bucketed_flag>;

/// Writes indices into the payload and values, widened to float, into scratch: for values stages
/// that need every value of a bucket before they can encode any.
template <class T, class Indices>
struct split_sink {
  std::uint8_t* indices;
  int index_width;
  float* values;
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t index, T value) const {
    Indices::store(indices, index_width, pos, index);
    values[pos] = static_cast<float>(to_float(value));
  }
};

/// The tensor index of value j: j itself for a dense structure.
struct identity_index {
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const { return j; }
};

/// Writes only the kept values (as floats), for a bucketed stage over an implicit selection.
template <class T>
struct values_sink {
  float* values;
  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t, T value) const {
    values[pos] = static_cast<float>(to_float(value));
  }
};

/// The tensor index of value j of an implicit selection (random-k), from its parameters.
template <class Structure>
struct implicit_index {
  frame_params params;
  std::uint64_t n, k;
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const {
    return Structure::index_of(params.structure, n, k, j);
  }
};

/// The tensor index of value j, read back from the payload's indices section.
template <class Indices>
struct stored_index {
  const std::uint8_t* indices;
  int index_width;
  GRADZIP_HOST_DEVICE std::uint64_t operator()(std::uint64_t j) const {
    return Indices::load(indices, index_width, j);
  }
};

/// Values stages whose codes do not fill all 2^bits values set `codes_need_check`.
template <class Values>
using needs_code_check = stage::detail::optional_flag<Values, stage::detail::codes_need_check_flag>;

/// Whether two functions or member functions are the same one. Template arguments compare the
/// entities, so no compiler has to fold a comparison of addresses into a constant.
template <auto F, auto G>
struct same_function : std::false_type {};
template <auto F>
struct same_function<F, F> : std::true_type {};

/**
 * A values stage's optional fast paths (quantize/natural.hpp has both), each equal to the general
 * function where it is taken:
 * - encode: `in_range_floor(record)` and `encode_in_range`, equal to `encode` for values that
 *   are 0 or finite with magnitude bits at least the floor; the executors take it for a block
 *   (host) or a warp step (CUDA) where every value qualifies;
 * - decode: `in_range_code_floor(record)` and `decode_in_range`, equal to `decode` for codes
 *   whose c = code >> 1 is 0 or at least the floor.
 * The stage names the class they belong to (`using in_range_class = natural;`), and a path
 * counts only where the general function and the fast ones are all that class's. A stage derived
 * from natural that writes its own `encode` (or `decode`) inherits natural's fast path, which
 * would code (or decode) its values as natural's; it is coded (decoded) by what it wrote.
 */
template <class S>
using in_range_class_t = typename S::in_range_class;
template <class S, class C>
using in_range_encode_functions =
    std::conjunction<same_function<&S::encode, &C::encode>, same_function<&S::encode_in_range, &C::encode_in_range>,
                     same_function<&S::in_range_floor, &C::in_range_floor>>;
template <class S, class C>
using in_range_decode_functions =
    std::conjunction<same_function<&S::decode, &C::decode>, same_function<&S::decode_in_range, &C::decode_in_range>,
                     same_function<&S::in_range_code_floor, &C::in_range_code_floor>>;

/// Functions<Values, ClassOf<Values>> (the class the stage names for a fast path), or false
/// where Values names no class or one of the functions is missing or overloaded (the detection
/// idiom; Functions and ClassOf alias templates).
template <template <class, class> class Functions, template <class> class ClassOf, class Values, class = void>
struct fast_path_of : std::false_type {};
template <template <class, class> class Functions, template <class> class ClassOf, class Values>
struct fast_path_of<Functions, ClassOf, Values, std::void_t<Functions<Values, ClassOf<Values>>>>
    : Functions<Values, ClassOf<Values>> {};

template <class Values>
inline constexpr bool has_in_range_encode = fast_path_of<in_range_encode_functions, in_range_class_t, Values>::value;
template <class Values>
inline constexpr bool has_in_range_decode = fast_path_of<in_range_decode_functions, in_range_class_t, Values>::value;

/**
 * Whether a stage's statistics are its bucket's extrema, which any order and any arithmetic give
 * exactly (the host reads 16-bit floats' bits: `extrema_of_16_bit`, detail/host/quantize.hpp).
 * Such a stage names the class it belongs to (`using extrema_class = uniform;`) and gives
 * `stats_of_extrema(lo, hi, finite)`: statistics whose `make_record` is that of the canonical
 * ones for a bucket whose least value is lo and greatest hi (either zero where a bucket holds
 * both) when all its values are finite (`finite`), and a poisoned record when one is not,
 * whatever lo and hi are then. It counts only where `empty_stats`, `add`, `merge`,
 * `make_record(stats, count)` and `stats_of_extrema` are all that class's: a stage derived from
 * uniform that writes its own has other statistics, or another use of them.
 */
template <class S>
using extrema_class_t = typename S::extrema_class;
template <class S>
using record_from_stats = typename S::record (*)(quantize::bucket_stats, std::uint64_t);
template <class S, class C>
using extrema_functions =
    std::conjunction<same_function<&S::empty_stats, &C::empty_stats>, same_function<&S::add, &C::add>,
                     same_function<&S::merge, &C::merge>, same_function<&S::stats_of_extrema, &C::stats_of_extrema>,
                     same_function<static_cast<record_from_stats<S>>(&S::make_record),
                                   static_cast<record_from_stats<C>>(&C::make_record)>>;
template <class Values>
inline constexpr bool has_extrema_stats = fast_path_of<extrema_functions, extrema_class_t, Values>::value;

/// The values of N codes of one bucket, each handed to `use(l, value)` as it is made: by
/// `decode_in_range` where the stage has it and every code qualifies (a vectorized pass over the
/// codes on the host), else by `decode`.
GRADZIP_EXEC_CHECK_DISABLE
template <class Values, class Code, int N, class Use>
GRADZIP_HOST_DEVICE inline void for_each_decoded(const Code (&code)[N], const typename Values::record& record,
                                                 Use use) {
  if constexpr (has_in_range_decode<Values>) {
    // (c - 1 < floor - 1: c = 0 wraps to the top) in the codes' own width, so that the host's
    // check of 32 byte codes is one vector, not four of 32-bit lanes. floor <= L + 1 fits it.
    const auto floor = static_cast<Code>(Values::in_range_code_floor(record));
    Code outside = 0;
    for (int l = 0; l < N; ++l) {
      outside |= static_cast<Code>(static_cast<Code>((code[l] >> 1) - 1u) < static_cast<Code>(floor - 1u));
    }
    if (outside == 0) {
      for (int l = 0; l < N; ++l) use(l, Values::decode_in_range(code[l], record));
      return;
    }
  }
  for (int l = 0; l < N; ++l) use(l, Values::decode(code[l], record));
}

/// The values of N codes of one bucket (`for_each_decoded`), into `value`.
template <class Values, class Code, int N>
GRADZIP_HOST_DEVICE inline void decode_codes(const Code (&code)[N], const typename Values::record& record,
                                             float (&value)[N]) {
  for_each_decoded<Values>(code, record, [&](int l, float v) { value[l] = v; });
}

/// 1 unless v is 0, or finite with magnitude bits at least `floor` (> 0): an integer, not a
/// bool, so that the host's loop over a block ORs it in vector registers.
GRADZIP_HOST_DEVICE inline std::uint32_t outside_encode_range(float v, std::uint32_t floor) {
  const std::uint32_t a = bit_cast<std::uint32_t>(v) & 0x7FFFFFFFu;
  return static_cast<std::uint32_t>(a - 1u < floor - 1u) | static_cast<std::uint32_t>(a >= 0x7F800000u);
}

/// values_backend<Exec>: bucketed values stages on an executor (host below, CUDA in cuda.cuh).
template <class Exec>
struct values_backend;

/// Writes each chosen element straight into the payload: its index through the indices stage
/// (when there is one), its value through the values stage. A stochastic element-wise stage
/// gets the element's random word, keyed by its seed, `ctx` and the element's tensor index.
template <class T, class Values, class Indices>
struct payload_sink {
  std::uint8_t* indices;
  int index_width;
  std::uint8_t* values;
  Values values_stage;
  quantize::compress_context ctx;

  GRADZIP_HOST_DEVICE void operator()(std::uint64_t pos, std::uint64_t index, T value) const {
    if constexpr (Indices::id != 0) Indices::store(indices, index_width, pos, index);
    if constexpr (stage::is_stochastic<Values>) {
      values_stage.store(values, pos, value, quantize::element_random(values_stage, index, ctx));
    } else {
      Values::store(values, pos, value);
    }
  }
};

/**
 * A sink that also carries one task for the selection to run before its result is complete: the
 * payload's frame, stored by the select kernel's first block instead of a launch of its own
 * (prologue(thread, threads): each of the block's threads its share). Structure backends that
 * declare `static constexpr bool writes_frame = true` run it (exactly once per select, whatever
 * k); codec compress hands them this sink (detail/codec_compress.hpp).
 */
template <class Sink, class Prologue>
struct sink_with_prologue : Sink {
  Prologue prologue_task;
  GRADZIP_HOST_DEVICE void prologue(unsigned thread, unsigned threads) const { prologue_task(thread, threads); }
};

template <class Sink, class = void>
inline constexpr bool has_prologue = false;
template <class Sink>
inline constexpr bool has_prologue<Sink, std::void_t<decltype(std::declval<const Sink&>().prologue(0u, 1u))>> = true;

/// Whether a structure backend's select runs its sink's prologue (it declares `writes_frame`).
template <class Backend, class = void>
inline constexpr bool writes_frame_v = false;
template <class Backend>
inline constexpr bool writes_frame_v<Backend, std::void_t<decltype(Backend::writes_frame)>> = Backend::writes_frame;

/// structure_backend<Exec, Structure>: how an executor runs a structure stage. Specialized for
/// the host below and for CUDA in gradzip/core/cuda.cuh.
template <class Exec, class Structure>
struct structure_backend;

/// Scratch a structure stage needs for n elements of T: its backend's
/// `workspace_bytes<T>(exec, structure, n)` when it has one (when the amount depends on the
/// stage's parameters, e.g. hashed top-k's slots), else `workspace_bytes<T>(exec, n)`.
template <class Backend, class T, class Exec, class Structure, class = void>
struct has_parameter_workspace : std::false_type {};
template <class Backend, class T, class Exec, class Structure>
struct has_parameter_workspace<Backend, T, Exec, Structure,
                               std::void_t<decltype(Backend::template workspace_bytes<T>(
                                   std::declval<Exec&>(), std::declval<const Structure&>(), std::size_t{}))>>
    : std::true_type {};

template <class T, class Exec, class Structure>
std::size_t structure_workspace(Exec& exec, const Structure& s, std::size_t n) {
  using backend = structure_backend<Exec, Structure>;
  if constexpr (has_parameter_workspace<backend, T, Exec, Structure>::value) {
    return backend::template workspace_bytes<T>(exec, s, n);
  } else {
    return backend::template workspace_bytes<T>(exec, n);
  }
}

/// payload_backend<Exec>: writing a payload's frame and decoding payloads on an executor.
template <class Exec>
struct payload_backend;

/// index_encoder<Exec>: choosing, sizing and writing a staged index encoding from sorted
/// indices in scratch (host: detail/host/encode.hpp, CUDA: detail/cuda/encode.cuh).
template <class Exec>
struct index_encoder;

}  // namespace gradzip::detail
