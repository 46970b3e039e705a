// gradzip's codecs behind one virtual interface, so that a Python object can hold any of them.
// The Python module builds float32 codecs on the host executor, and in GRADZIP_PYTHON_CUDA builds
// on gradzip::cuda too (device.cuh); each call is the C++ codec's own call (no copies, the same
// bytes).
#pragma once

#include <gradzip/gradzip.hpp>
#include <gradzip/hash/simhash.hpp>
#include <gradzip/transform/hadamard.hpp>

#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include "device.hpp"
#include "spec.hpp"

namespace gradzip_py {

namespace gz = gradzip;
using bytes_view = gz::span<const std::byte>;

/// Where an allreduce may sum a summable codec's payloads: the values section.
struct summable_section {
  std::size_t offset = 0;  ///< bytes from the payload's start
  std::size_t bytes = 0;
  std::string dtype;  ///< "float32", "float64", "float16" or "bfloat16"
};

/// Error feedback (feedback::error_feedback) around one codec, for one tensor size.
class any_feedback {
 public:
  virtual ~any_feedback() = default;
  virtual std::size_t compress(gz::host& exec, gz::span<const float> grad, gz::span<std::byte> out,
                               gz::quantize::compress_context ctx) = 0;
  virtual std::vector<std::byte> save(gz::host& exec) const = 0;
  virtual void restore(gz::host& exec, bytes_view state) = 0;
};

class any_codec {
 public:
  virtual ~any_codec() = default;
  virtual std::size_t max_compressed_bytes(std::size_t n) const = 0;
  virtual std::size_t workspace_bytes(gz::host& exec, std::size_t n) const = 0;
  virtual std::size_t compress(gz::host& exec, gz::span<const float> x, gz::span<std::byte> out,
                               gz::quantize::compress_context ctx) const = 0;
  virtual void decompress(gz::host& exec, bytes_view payload, gz::span<float> out) const = 0;
  virtual void decompress_add(gz::host& exec, bytes_view payload, gz::span<float> accum, float alpha) const = 0;
  /// Every payload validated before accum changes; a bad one throws format_error naming its
  /// position ("payload 2 of 4: ...").
  virtual void decompress_add_all(gz::host& exec, gz::span<const bytes_view> payloads, gz::span<float> accum,
                                  float alpha) const = 0;
  /// out <- the sum of every payload's decode, all validated before out changes.
  virtual void decompress_all(gz::host& exec, gz::span<const bytes_view> payloads, gz::span<float> out) const = 0;
  virtual std::optional<summable_section> summable(std::size_t n) const = 0;
  /// Whether every payload for n elements has exactly max_compressed_bytes(n) bytes (the count
  /// is the structure's, the index encoding is not staged): peers then need no size exchange.
  virtual bool fixed_size() const = 0;
  virtual std::unique_ptr<any_feedback> error_feedback(gz::host& exec, std::size_t n) const = 0;
  /// The same codec on CUDA tensors; null when the module was built without CUDA.
  virtual const any_device_codec* device() const = 0;
};

/// Defined in device.cuh, which every translation unit that erases a codec includes in
/// GRADZIP_PYTHON_CUDA builds (nvcc compiles them).
template <class Codec>
std::unique_ptr<any_device_codec> make_device_codec(const Codec& codec);

template <class Codec>
class erased_feedback final : public any_feedback {
 public:
  erased_feedback(gz::host& exec, const Codec& codec, std::size_t n) : ef_(exec, codec, n) {}
  std::size_t compress(gz::host& exec, gz::span<const float> grad, gz::span<std::byte> out,
                       gz::quantize::compress_context ctx) override {
    return ef_.compress(exec, grad, out, ctx);
  }
  std::vector<std::byte> save(gz::host& exec) const override { return ef_.save(exec); }
  void restore(gz::host& exec, bytes_view state) override { ef_.restore(exec, state); }

 private:
  gz::feedback::error_feedback<Codec, float, gz::host> ef_;
};

namespace detail {
template <class C, class = void>
struct has_decompress_add_all : std::false_type {};
template <class C>
struct has_decompress_add_all<C, std::void_t<decltype(std::declval<const C&>().decompress_add_all(
                                     std::declval<gz::host&>(), std::declval<gz::span<const bytes_view>>(),
                                     std::declval<gz::span<float>>(), 1.0f))>> : std::true_type {};

/// Whether C is a gz::codec (a structure, values and index stage), not a whole codec of its own
/// (SimHash, a rotation).
template <class C>
inline constexpr bool is_codec = false;
template <class S, class V, class I>
inline constexpr bool is_codec<gz::codec<S, V, I>> = true;

inline const char* dtype_name(gz::element_type t) {
  switch (t) {
    case gz::element_type::f32: return "float32";
    case gz::element_type::f64: return "float64";
    case gz::element_type::f16: return "float16";
    case gz::element_type::bf16: return "bfloat16";
  }
  return "unknown";
}
}  // namespace detail

template <class Codec>
class erased_codec final : public any_codec {
 public:
  explicit erased_codec(Codec codec) : codec_(codec) {
#if GRADZIP_PYTHON_CUDA
    device_ = make_device_codec(codec_);
#endif
  }

  std::size_t max_compressed_bytes(std::size_t n) const override {
    return codec_.template max_compressed_bytes<float>(n);
  }
  std::size_t workspace_bytes(gz::host& exec, std::size_t n) const override {
    return codec_.template workspace_bytes<float>(exec, n);
  }
  std::size_t compress(gz::host& exec, gz::span<const float> x, gz::span<std::byte> out,
                       gz::quantize::compress_context ctx) const override {
    return codec_.compress(exec, x, out, ctx);
  }
  void decompress(gz::host& exec, bytes_view payload, gz::span<float> out) const override {
    codec_.decompress(exec, payload, out);
  }
  void decompress_add(gz::host& exec, bytes_view payload, gz::span<float> accum, float alpha) const override {
    codec_.decompress_add(exec, payload, accum, alpha);
  }
  void decompress_add_all(gz::host& exec, gz::span<const bytes_view> payloads, gz::span<float> accum,
                          float alpha) const override {
    if constexpr (detail::has_decompress_add_all<Codec>::value) {
      codec_.decompress_add_all(exec, payloads, accum, alpha);
    } else {
      // Codecs without a fused multi-payload decode (SimHash, rotations): each payload decodes
      // (and is validated) into a scratch sum first, so a bad one leaves accum unchanged.
      std::vector<float> sum(accum.size(), 0.0f);
      for (std::size_t m = 0; m < payloads.size(); ++m) {
        try {
          codec_.decompress_add(exec, payloads[m], gz::span<float>(sum), 1.0f);
        } catch (const gz::format_error& e) {
          throw gz::format_error(e.code(), gz::detail::concat("payload ", m, " of ", payloads.size(), ": ", e.what()));
        }
      }
      for (std::size_t i = 0; i < accum.size(); ++i) accum[i] += alpha * sum[i];
    }
  }
  void decompress_all(gz::host& exec, gz::span<const bytes_view> payloads, gz::span<float> out) const override {
    if constexpr (detail::has_decompress_add_all<Codec>::value) {
      codec_.decompress_all(exec, payloads, out);
    } else {
      GRADZIP_EXPECTS(!payloads.empty(), "decompress_all: no payloads");
      std::vector<float> sum(out.size(), 0.0f);
      decompress_add_all(exec, payloads, gz::span<float>(sum), 1.0f);
      std::copy(sum.begin(), sum.end(), out.begin());
    }
  }
  std::optional<summable_section> summable(std::size_t n) const override {
    if constexpr (detail::is_codec<Codec>) {
      if constexpr (gz::comm::allreducer<Codec, float, gz::host>::summable_path()) {
        const auto layout = Codec::layout(gz::element_type::f32, n, codec_.structure().selected_count(n));
        const auto& values = layout.at(Codec::section_count - 1);
        const auto type = *gz::stage::summed_as<typename Codec::values_type>(gz::element_type::f32);
        return summable_section{static_cast<std::size_t>(values.offset), static_cast<std::size_t>(values.size),
                                detail::dtype_name(type)};
      }
    }
    (void)n;
    return std::nullopt;
  }
  bool fixed_size() const override {
    if constexpr (detail::is_codec<Codec>) {
      return !Codec::data_dependent_count && !Codec::staged;
    } else {
      return false;
    }
  }
  std::unique_ptr<any_feedback> error_feedback(gz::host& exec, std::size_t n) const override {
    return std::make_unique<erased_feedback<Codec>>(exec, codec_, n);
  }
  const any_device_codec* device() const override { return device_.get(); }

 private:
  Codec codec_;
  std::unique_ptr<any_device_codec> device_;  // null without CUDA
};

template <class Codec>
std::unique_ptr<any_codec> erase(Codec c) {
  return std::make_unique<erased_codec<Codec>>(c);
}

/// Builds the codec a parsed spec names. The families live in separate translation units
/// (codecs_*.cpp) so they compile in parallel; each returns null for a structure it does not own.
std::unique_ptr<any_codec> make_codec(const parsed_spec& spec);

/// A spec split into its stages' roles.
struct roles {
  const stage* structure = nullptr;  // null: dense
  const stage* values = nullptr;     // null: none
  const stage* encoding = nullptr;   // null: the structure's default
};

std::unique_ptr<any_codec> make_dense_family(const parsed_spec& spec, const roles& r);   // dense, randomk, hadamard
std::unique_ptr<any_codec> make_topk_family(const parsed_spec& spec, const roles& r);    // topk
std::unique_ptr<any_codec> make_sparse_family(const parsed_spec& spec, const roles& r);  // the other sparsifiers

/// Calls f(values stage) with the values stage the spec names: every values stage gradzip has.
template <class F>
auto visit_values(const parsed_spec& spec, const stage* v, F&& f) {
  namespace q = gz::quantize;
  if (v == nullptr) return f(q::none{});
  arguments a(*v, spec.text);
  const std::string& name = v->name;
  if (name == "none" || name == "fp32") { a.finish(); return f(q::none{}); }
  if (name == "fp16") { a.finish(); return f(q::cast_fp16{}); }
  if (name == "bf16") { a.finish(); return f(q::cast_bf16{}); }
  if (name == "fp8_e4m3") { a.finish(); return f(q::cast_fp8_e4m3{}); }
  if (name == "fp8_e5m2") { a.finish(); return f(q::cast_fp8_e5m2{}); }
  if (name == "sign") { a.finish(); return f(q::sign<false>{}); }
  if (name == "scaled_sign") { a.finish(); return f(q::scaled_sign{}); }
  if (name == "onebit") { a.finish(); return f(q::onebit<>{}); }
  if (name == "uniform") {
    const std::uint64_t bits = a.integer("bits", 8);
    const bool stochastic = a.flag("stochastic", false);
    const std::uint64_t seed = a.integer("seed", 0);
    a.finish();
    using st = q::rounding;
    if (bits == 8) return stochastic ? f(q::uniform<8, st::stochastic>{seed}) : f(q::uniform<8>{seed});
    if (bits == 4) return stochastic ? f(q::uniform<4, st::stochastic>{seed}) : f(q::uniform<4>{seed});
    if (bits == 2) return stochastic ? f(q::uniform<2, st::stochastic>{seed}) : f(q::uniform<2>{seed});
    throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': uniform bits must be 2, 4 or 8, got ", bits));
  }
  if (name == "qsgd") {
    const std::uint64_t bits = a.integer("bits", 4);
    const std::uint64_t seed = a.integer("seed", 0);
    a.finish();
    if (bits == 4) return f(q::qsgd<7>{seed});  // 7 levels + sign in 4 bits
    if (bits == 8) return f(q::qsgd<127>{seed});
    throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': qsgd bits must be 4 or 8, got ", bits));
  }
  if (name == "terngrad") {
    const bool clip = a.flag("clip", false);
    const std::uint64_t seed = a.integer("seed", 0);
    a.finish();
    if (clip) {
      q::terngrad<true> t;
      t.seed = seed;
      return f(t);
    }
    q::terngrad<> t;
    t.seed = seed;
    return f(t);
  }
  if (name == "natural") {
    const std::uint64_t bits = a.integer("bits", 8);
    const std::uint64_t seed = a.integer("seed", 0);
    a.finish();
    if (bits == 8) return f(q::natural<8>{seed});
    if (bits == 9) return f(q::natural<9>{seed});
    throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': natural bits must be 8 or 9, got ", bits));
  }
  throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': unknown values stage '", name, "'"));
}

/// The index encoding a spec names (coo when it names none), as a type.
template <class F>
auto visit_encoding(const parsed_spec& spec, const stage* e, F&& f) {
  namespace en = gz::encode;
  if (e == nullptr) return f(en::coo{});
  arguments(*e, spec.text).finish();
  if (e->name == "coo") return f(en::coo{});
  if (e->name == "bitmap") return f(en::bitmap{});
  if (e->name == "delta_varint") return f(en::delta_varint{});
  if (e->name == "automatic") return f(en::automatic{});
  throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': unknown encoding '", e->name, "'"));
}

/// The error for a combination of stages this module does not instantiate.
[[noreturn]] inline void not_built(const parsed_spec& spec, const std::string& why) {
  throw gz::invalid_argument(gz::detail::concat("codec spec '", spec.text, "': ", why,
                                                " (docs/pytorch.md lists the combinations the module builds)"));
}

}  // namespace gradzip_py
