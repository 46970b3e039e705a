// Dense codecs (every values stage), random-k (every values stage; its indices are not sent)
// and Hadamard-rotated dense quantizers.
#include "family.hpp"

namespace gradzip_py {
namespace {

template <class V>
inline constexpr bool is_uniform_or_qsgd = false;
template <int B, gz::quantize::rounding R, std::uint32_t K>
inline constexpr bool is_uniform_or_qsgd<gz::quantize::uniform<B, R, K>> = true;
template <unsigned L, std::uint32_t K>
inline constexpr bool is_uniform_or_qsgd<gz::quantize::qsgd<L, K>> = true;

}  // namespace

std::unique_ptr<any_codec> make_dense_family(const parsed_spec& spec, const roles& r) {
  namespace sp = gz::sparsify;
  if (r.encoding != nullptr && r.encoding->name != "none") {
    const std::string s = r.structure ? r.structure->name : std::string("a dense codec");
    if (r.structure == nullptr || r.structure->name == "randomk" || r.structure->name == "hadamard") {
      not_built(spec, s + " sends no indices: encoding '" + r.encoding->name + "' does not apply");
    }
  }
  if (r.structure == nullptr || r.structure->name == "dense") {
    if (r.structure) arguments(*r.structure, spec.text).finish();
    return visit_values(spec, r.values, [](auto v) {
      return erase(gz::codec<sp::none, decltype(v), gz::encode::none>{{}, v});
    });
  }
  if (r.structure->name == "randomk") {
    arguments a(*r.structure, spec.text);
    const bool has_ratio = a.has("ratio");
    GRADZIP_EXPECTS(has_ratio != a.has("k"), "codec spec '", spec.text, "': randomk needs exactly one of ratio= and k=");
    const double ratio = a.number("ratio", 0.0);
    const std::uint64_t k = a.integer("k", 0);
    const std::uint64_t seed = a.integer("seed", 0);
    const bool scaled = a.flag("scaled", true);
    a.finish();
    const sp::randomk s = has_ratio ? sp::randomk::ratio(ratio, seed, scaled) : sp::randomk::count(k, seed, scaled);
    return visit_values(spec, r.values, [&](auto v) {
      return erase(gz::codec<sp::randomk, decltype(v), gz::encode::none>{s, v});
    });
  }
  if (r.structure->name == "hadamard") {
    arguments a(*r.structure, spec.text);
    const auto block = a.integer("block", 1024);
    const auto seed = a.integer("seed", 0x4ad);
    a.finish();
    GRADZIP_EXPECTS(block <= 0xFFFFFFFFu, "codec spec '", spec.text, "': hadamard block ", block, " is too large");
    const gz::transform::hadamard rotation{static_cast<std::uint32_t>(block), seed};
    return visit_values(spec, r.values, [&](auto v) -> std::unique_ptr<any_codec> {
      using V = decltype(v);
      if constexpr (is_uniform_or_qsgd<V>) {
        using inner = gz::codec<sp::none, V, gz::encode::none>;
        return erase(gz::transform::rotated<inner>{inner{{}, v}, rotation});
      } else {
        not_built(spec, "hadamard rotates the uniform and qsgd quantizers only");
      }
    });
  }
  return nullptr;
}

}  // namespace gradzip_py
