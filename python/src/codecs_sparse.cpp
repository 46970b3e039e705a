// DGC's sampled top-k, the threshold and block-wise sparsifiers, and hashed top-k: every index
// encoding with the values as they are, and COO with a 16-bit cast or uniform 8-bit values.
// SimHash too.
#include "family.hpp"

namespace gradzip_py {
namespace {

template <class V>
inline constexpr bool small_values =
    std::is_same_v<V, gz::quantize::none> || std::is_same_v<V, gz::quantize::cast_fp16> ||
    std::is_same_v<V, gz::quantize::cast_bf16> || std::is_same_v<V, gz::quantize::uniform<8>>;

template <class S>
std::unique_ptr<any_codec> with_stages(const parsed_spec& spec, const roles& r, const S& s) {
  const bool plain = r.values == nullptr || r.values->name == "none";
  if (!plain && r.encoding != nullptr && r.encoding->name != "coo") {
    not_built(spec, r.structure->name + " with encoding '" + r.encoding->name + "' sends its values as they are");
  }
  if (plain) {
    if (r.values) arguments(*r.values, spec.text).finish();
    return visit_encoding(spec, r.encoding, [&](auto e) {
      return erase(gz::codec<S, gz::quantize::none, decltype(e)>{s});
    });
  }
  if (r.encoding) arguments(*r.encoding, spec.text).finish();
  return visit_values(spec, r.values, [&](auto v) -> std::unique_ptr<any_codec> {
    using V = decltype(v);
    if constexpr (small_values<V>) {
      return erase(gz::codec<S, V, gz::encode::coo>{s, v});
    } else {
      not_built(spec, r.structure->name + "'s values may be none, fp16, bf16 or uniform(bits=8)");
    }
  });
}

}  // namespace

std::unique_ptr<any_codec> make_sparse_family(const parsed_spec& spec, const roles& r) {
  namespace sp = gz::sparsify;
  if (r.structure == nullptr) return nullptr;
  const std::string& name = r.structure->name;
  if (name == "simhash") {
    GRADZIP_EXPECTS(r.values == nullptr && r.encoding == nullptr, "codec spec '", spec.text,
                    "': simhash is a whole codec (no values or encoding stage)");
    arguments a(*r.structure, spec.text);
    const auto block = a.integer("block", 1024), bits = a.integer("bits", 128), seed = a.integer("seed", 0);
    a.finish();
    GRADZIP_EXPECTS(block <= 0xFFFFFFFFu && bits <= 0xFFFFFFFFu, "codec spec '", spec.text,
                    "': simhash block and bits must fit 32 bits");
    return erase(gz::hash::simhash{static_cast<std::uint32_t>(block), static_cast<std::uint32_t>(bits), seed});
  }
  arguments a(*r.structure, spec.text);
  if (name == "sampled_topk") {
    const bool has_ratio = a.has("ratio");
    GRADZIP_EXPECTS(has_ratio != a.has("k"), "codec spec '", spec.text,
                    "': sampled_topk needs exactly one of ratio= and k=");
    const double ratio = a.number("ratio", 0.0);
    const std::uint64_t k = a.integer("k", 0);
    const double rate = a.number("sample_rate", sp::sampled_topk::default_sample_rate);
    const std::uint64_t seed = a.integer("seed", 0x5eed);
    a.finish();
    const sp::sampled_topk s = has_ratio ? sp::sampled_topk::ratio(ratio, rate, seed) : sp::sampled_topk::count(k, rate, seed);
    return with_stages(spec, r, s);
  }
  if (name == "threshold") {
    const double tau = a.required("tau");
    a.finish();
    return with_stages(spec, r, sp::threshold{tau});
  }
  if (name == "blockwise_topk") {
    const std::uint64_t block = a.integer("block", 1024);
    const std::uint64_t k = a.integer("k", 0);
    GRADZIP_EXPECTS(a.has("k"), "codec spec '", spec.text, "': blockwise_topk needs k= (kept per block)");
    a.finish();
    return with_stages(spec, r, sp::blockwise_topk{block, k});
  }
  if (name == "hashed_topk") {
    const double ratio = a.required("ratio");
    const double slots = a.number("slots", 0.0);
    const double rate = a.number("sample_rate", 0.01);
    const std::uint64_t seed = a.integer("seed", 0xd2a6);
    a.finish();
    return with_stages(spec, r, gz::hash::hashed_topk::ratio(ratio, slots, rate, seed));
  }
  return nullptr;
}

}  // namespace gradzip_py
