// Every quantizer through every element type, at edge sizes: a payload made from any input type
// equals the one made from the same values as float (but for the header's type byte), and
// decoding into any accumulator type equals decoding into float, then rounding once.
#include <catch2/catch.hpp>

#include <cstring>

#include "common/helpers.hpp"
#include "common/synthetic_gradient.hpp"

using namespace gradzip;

namespace {

template <class Values>
using dense = test::dense<Values>;

template <class T>
std::vector<T> converted(const std::vector<float>& x) {
  std::vector<T> out(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) out[i] = from_double<T>(x[i]);
  return out;
}

template <class Codec, class T>
std::vector<std::byte> payload_of(const Codec& c, host& exec, const std::vector<T>& x) {
  return test::compress(c, exec, x, {6, 1});
}

template <class Codec, class T>
void check_input_type(const Codec& c, const std::vector<float>& base) {
  host exec;
  const auto x = converted<T>(base);
  std::vector<float> as_float(x.size());
  for (std::size_t i = 0; i < x.size(); ++i) as_float[i] = static_cast<float>(to_float(x[i]));
  auto from_t = payload_of(c, exec, x);
  const auto from_float = payload_of(c, exec, as_float);
  REQUIRE(from_t.size() == from_float.size());
  from_t[6] = from_float[6];  // the header's element type byte
  REQUIRE(std::memcmp(from_t.data(), from_float.data(), from_t.size()) == 0);
}

template <class Codec, class U>
void check_output_type(const Codec& c, const std::vector<std::byte>& p, const std::vector<float>& decoded) {
  host exec;
  std::vector<U> out(decoded.size(), from_double<U>(3.0));
  c.decompress(exec, span<const std::byte>(p), span<U>(out));
  for (std::size_t i = 0; i < out.size(); ++i) {
    const U expected = from_double<U>(decoded[i]);
    REQUIRE(std::memcmp(&out[i], &expected, sizeof(U)) == 0);
  }
}

template <class Values>
void check_all_types(Values values) {
  const dense<Values> c{{}, values};
  const codec<sparsify::topk, Values> sparse{sparsify::topk::ratio(0.1), values};
  for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{31}, std::size_t{127}, std::size_t{129},
                        std::size_t{511}, std::size_t{513}, std::size_t{1003}}) {
    const auto base = gradzip_tools::synthetic_gradient<float>(n, 90 + n);
    check_input_type<dense<Values>, double>(c, base);
    check_input_type<decltype(sparse), double>(sparse, base);
#if GRADZIP_HAS_HALF
    check_input_type<dense<Values>, __half>(c, base);
    check_input_type<dense<Values>, __nv_bfloat16>(c, base);
    check_input_type<decltype(sparse), __nv_bfloat16>(sparse, base);
#endif
    host exec;
    const auto p = payload_of(c, exec, base);
    std::vector<float> decoded(n);
    c.decompress(exec, span<const std::byte>(p), span<float>(decoded));
    check_output_type<dense<Values>, double>(c, p, decoded);
#if GRADZIP_HAS_HALF
    check_output_type<dense<Values>, __half>(c, p, decoded);
    check_output_type<dense<Values>, __nv_bfloat16>(c, p, decoded);
#endif
  }
}

}  // namespace

TEST_CASE("every quantizer round trips through every element type at edge sizes", "[types]") {
  check_all_types(quantize::cast_fp16{});
  check_all_types(quantize::cast_bf16{});
  check_all_types(quantize::cast_fp8_e4m3{});
  check_all_types(quantize::cast_fp8_e5m2{});
  check_all_types(quantize::uniform<1>{});
  check_all_types(quantize::uniform<3>{});
  check_all_types(quantize::uniform<8, quantize::rounding::stochastic, 64>{5});
  check_all_types(quantize::qsgd<7>{5});
  check_all_types(quantize::qsgd<5, 256>{5});
  check_all_types(quantize::terngrad<true>{5});
  check_all_types(quantize::sign<false>{});
  check_all_types(quantize::scaled_sign{});
  check_all_types(quantize::onebit<>{});
  check_all_types(quantize::natural<8>{5});
  check_all_types(quantize::natural<9, 32>{5});
}
