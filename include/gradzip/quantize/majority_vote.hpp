/**
 * @file majority_vote.hpp
 * @brief `quantize::majority_vote`: signSGD's aggregation of workers' sign payloads.
 *
 * Bernstein, Zhao, Azizzadenesheli, Anandkumar, "signSGD with majority vote is communication
 * efficient and fault tolerant" (ICLR 2019). Each of M workers sends sign(g_m) (a
 * `quantize::sign<false>` payload, decoding to ±1; zero was sent as +1). The server, or every
 * worker after an allgather, computes
 *
 *     out = sign( Σ_m decode(payload_m) )      (+1, −1, or 0 on a tie)
 *
 * Elements a sparsifier did not send count as 0 votes. The votes are summed in `out` itself, so
 * T must hold the worker count exactly: any M for float and double, M <= 2048 for fp16 and
 * M <= 256 for bf16 (checked). Every payload is validated before `out` is written, so a bad one
 * leaves `out` unchanged (`codec::decompress_all`). On CUDA the work is stream-ordered; decoding
 * errors surface through `exec.check()`.
 *
 * @code
 * using sign_codec = gradzip::codec<gradzip::sparsify::none, gradzip::quantize::sign<false>,
 *                                   gradzip::encode::none>;
 * std::vector<gradzip::span<const std::byte>> received;   // one payload per worker
 * std::vector<float> update(n);
 * gradzip::quantize::majority_vote(exec, sign_codec{}, gradzip::span<const gradzip::span<const std::byte>>(received),
 *                                  gradzip::span<float>(update));
 * @endcode
 */
#pragma once

#include <type_traits>

#include "gradzip/codec.hpp"
#include "gradzip/core/executor.hpp"

namespace gradzip::quantize {

template <class Values>
struct is_plain_sign : std::false_type {};
template <std::uint32_t Bucket>
struct is_plain_sign<sign<false, Bucket>> : std::true_type {};

template <class Exec, class Codec, class T>
void majority_vote(Exec& exec, const Codec& codec, span<const span<const std::byte>> payloads,
                   span<T> out) {
  static_assert(is_plain_sign<typename Codec::values_type>::value,
                "majority_vote: payloads must hold plain signs (quantize::sign<false>)");
  GRADZIP_EXPECTS(!payloads.empty(), "majority_vote: no payloads");
  const std::size_t exact_votes = std::is_same_v<T, float> || std::is_same_v<T, double>
                                      ? ~std::size_t{0}
                                      : (element_traits<T>::type == element_type::f16 ? 2048 : 256);
  GRADZIP_EXPECTS(payloads.size() <= exact_votes, "majority_vote: ", payloads.size(),
                  " votes do not count exactly in ", element_type_name(element_traits<T>::type),
                  " (at most ", exact_votes, "); vote into float");
  codec.decompress_all(exec, payloads, out);  // all validated before `out` is written
  gradzip::detail::executor_ops<Exec>::sign(exec, out);  // CUDA: skipped after a failure
}

}  // namespace gradzip::quantize
