// Exact top-k: with COO indices under every values stage, and with every index encoding when
// the values are sent as they are.
#include "family.hpp"

namespace gradzip_py {

std::unique_ptr<any_codec> make_topk_family(const parsed_spec& spec, const roles& r) {
  namespace sp = gz::sparsify;
  if (r.structure == nullptr || r.structure->name != "topk") return nullptr;
  arguments a(*r.structure, spec.text);
  const bool has_ratio = a.has("ratio");
  GRADZIP_EXPECTS(has_ratio != a.has("k"), "codec spec '", spec.text, "': topk needs exactly one of ratio= and k=");
  const double ratio = a.number("ratio", 0.0);
  const std::uint64_t k = a.integer("k", 0);
  a.finish();
  const sp::topk s = has_ratio ? sp::topk::ratio(ratio) : sp::topk::count(k);
  if (r.encoding == nullptr || r.encoding->name == "coo") {
    if (r.encoding) arguments(*r.encoding, spec.text).finish();
    return visit_values(spec, r.values, [&](auto v) {
      return erase(gz::codec<sp::topk, decltype(v), gz::encode::coo>{s, v});
    });
  }
  if (r.values != nullptr && r.values->name != "none") {
    not_built(spec, "top-k with encoding '" + r.encoding->name + "' sends its values as they are (values 'none')");
  }
  return visit_encoding(spec, r.encoding, [&](auto e) {
    return erase(gz::codec<sp::topk, gz::quantize::none, decltype(e)>{s});
  });
}

}  // namespace gradzip_py
