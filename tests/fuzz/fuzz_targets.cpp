// libFuzzer targets, one per family of decoder entry points, selected at compile time with
// -DGRADZIP_FUZZ_TARGET=<n> (tests/fuzz/run.cmake and tools/fuzz.sh build each):
//   1 sparse     codec decoders of every sparse structure and index encoding
//   2 dense      codec decoders of every values stage over the dense structure
//   3 randomk    random-k's implicit indices under several values stages
//   4 sketch     count sketch estimate, merge and unsketch; FetchSGD restore and step
//   5 hashing    SimHash configurations; Hadamard-rotated codecs (nested payloads)
//   6 states     error feedback, momentum correction and Signum restore; majority vote
//   7 partition  Zen's hash bitmap
//   8 lowrank    PowerSGD's P and Q payloads and its restore; Zen's sparse_sync parts, reduced
//                parts, whole payloads and stages, through a communicator that delivers the input
// In targets 1-4, byte 0 of an input picks one configuration (codec, or sketch entry point) and
// the rest is the payload: each input costs one decoder, not the family, so a long run reaches
// 10^7 executions in CPU-minutes, and a mutated byte 0 still feeds one codec another's payload.
// Any byte string either decodes or raises gradzip::format_error: any other exception aborts
// (a finding), as do ASan/UBSan reports, an allocation over -malloc_limit_mb, and a timeout.
// With GRADZIP_FUZZ_SEEDS=<dir> set, the target first writes valid payloads of every
// configuration it decodes into <dir>: the corpus it starts from.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "gradzip/gradzip.hpp"

namespace gz = gradzip;
using bytes_t = gz::span<const std::byte>;

namespace {

/// The tensor size a payload claims when it is at most `limit`, else 16 (the harness's own buffers
/// stay small, and runs fast; the size check itself is then what the bytes meet).
std::size_t claimed_size(bytes_t bytes, std::uint64_t limit = 4096) {
  try {
    const auto h = gz::wire::read_header(bytes);
    if (h.element_count <= limit) return static_cast<std::size_t>(h.element_count);
  } catch (const gz::format_error&) {
  }
  return 16;
}

template <class F>
void attempt(F f) {
  try {
    f();
  } catch (const gz::format_error&) {
  }
}

/// A deterministic gradient with a few large entries, for seeds.
std::vector<float> sample_gradient(std::size_t n, std::uint32_t salt) {
  std::vector<float> g(n);
  std::uint32_t s = 2463534242u ^ salt;
  for (std::size_t i = 0; i < n; ++i) {
    s ^= s << 13;
    s ^= s >> 17;
    s ^= s << 5;
    g[i] = (static_cast<float>(s % 2001) - 1000.0f) / 1000.0f * (i % 37 == 0 ? 50.0f : 1.0f);
  }
  return g;
}

std::vector<std::vector<std::byte>> seeds;

/// A seed for the configuration `which` of targets 1-4 and 8: the selector byte, then the payload.
void push_selected(std::size_t which, bytes_t payload) {
  std::vector<std::byte> seed{static_cast<std::byte>(which)};
  seed.insert(seed.end(), payload.begin(), payload.end());
  seeds.push_back(seed);
}

/// Byte 0 of an input modulo `count` (the configuration), and the payload after it.
struct selection {
  std::size_t which;
  bytes_t payload;
};

selection pick(bytes_t bytes, std::size_t count) {
  if (bytes.empty()) return {0, bytes};
  return {std::to_integer<std::size_t>(bytes[0]) % count, bytes.subspan(1, bytes.size() - 1)};
}

template <class Codec>
void seed_codec(std::size_t which, const Codec& c) {
  gz::host exec(1);
  std::uint32_t salt = 0;
  for (std::size_t n : {1, 100, 1000}) {
    const auto g = sample_gradient(n, ++salt);
    std::vector<std::byte> out(c.template max_compressed_bytes<float>(n));
    out.resize(c.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out), {7, 3}));
    push_selected(which, out);
  }
}

/// Every decoder entry point of a codec over the same bytes: add, overwrite, all-of (with a
/// second copy), into float and double.
template <class Codec>
void decode_codec(const Codec& c, bytes_t bytes) {
  gz::host exec(1);
  const std::size_t n = claimed_size(bytes);
  std::vector<float> accum(n, 1.0f);
  std::vector<double> dense(n, 1.0);
  attempt([&] { c.decompress_add(exec, bytes, gz::span<float>(accum), 0.5f); });
  attempt([&] { c.decompress(exec, bytes, gz::span<double>(dense)); });
  const bytes_t twice[2] = {bytes, bytes};
  attempt([&] { c.decompress_add_all(exec, gz::span<const bytes_t>(twice, 2), gz::span<float>(accum)); });
  attempt([&] { c.decompress_all(exec, gz::span<const bytes_t>(twice, 2), gz::span<double>(dense)); });
}

#if GRADZIP_FUZZ_TARGET <= 3
template <class F>
void each_config(F f);  // the target's codecs, in selector order

std::size_t config_count() {
  std::size_t count = 0;
  each_config([&](const auto&) { ++count; });
  return count;
}

void make_seeds() {
  std::size_t which = 0;
  each_config([&](const auto& c) { seed_codec(which++, c); });
}

void fuzz(bytes_t bytes) {
  static const std::size_t count = config_count();
  const auto [which, payload] = pick(bytes, count);
  std::size_t i = 0;
  each_config([&, which = which, payload = payload](const auto& c) {
    if (i++ == which) decode_codec(c, payload);
  });
}
#endif

#if GRADZIP_FUZZ_TARGET == 1
using topk_coo = gz::codec<gz::sparsify::topk>;
using topk_bitmap = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::bitmap>;
using topk_delta = gz::codec<gz::sparsify::topk, gz::quantize::none, gz::encode::delta_varint>;
using topk_auto_u4 = gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>, gz::encode::automatic>;
using topk_fp16 = gz::codec<gz::sparsify::topk, gz::quantize::cast_fp16, gz::encode::coo>;
using threshold_bitmap = gz::codec<gz::sparsify::threshold, gz::quantize::none, gz::encode::bitmap>;
using sampled = gz::codec<gz::sparsify::sampled_topk, gz::quantize::none, gz::encode::automatic>;
using blockwise = gz::codec<gz::sparsify::blockwise_topk>;
using hashed = gz::codec<gz::hash::hashed_topk, gz::quantize::none, gz::encode::automatic>;

template <class F>
void each_config(F f) {
  f(topk_coo{gz::sparsify::topk::ratio(0.05)});
  f(topk_bitmap{gz::sparsify::topk::ratio(0.2)});
  f(topk_delta{gz::sparsify::topk::ratio(0.05)});
  f(topk_auto_u4{gz::sparsify::topk::ratio(0.3)});
  f(topk_fp16{gz::sparsify::topk::ratio(0.05)});
  f(threshold_bitmap{gz::sparsify::threshold{0.9f}});
  f(sampled{gz::sparsify::sampled_topk::ratio(0.05, 0.05, 3)});
  f(blockwise{gz::sparsify::blockwise_topk{64, 4}});
  f(hashed{gz::hash::hashed_topk::ratio(0.05, 0.2)});
}

#elif GRADZIP_FUZZ_TARGET == 2
template <class Values>
using dense = gz::codec<gz::sparsify::none, Values, gz::encode::none>;
using stochastic2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic, 64>;

template <class F>
void each_config(F f) {
  f(dense<gz::quantize::none>{});
  f(dense<gz::quantize::cast_fp16>{});
  f(dense<gz::quantize::cast_bf16>{});
  f(dense<gz::quantize::cast_fp8_e4m3>{});
  f(dense<gz::quantize::cast_fp8_e5m2>{});
  f(dense<gz::quantize::uniform<4>>{});
  f(dense<gz::quantize::uniform<12, gz::quantize::rounding::nearest, 64>>{});
  f(dense<stochastic2>{{}, stochastic2{5}});
  f(dense<gz::quantize::qsgd<7>>{{}, gz::quantize::qsgd<7>{5}});
  f(dense<gz::quantize::terngrad<>>{{}, gz::quantize::terngrad<>{5}});
  f(dense<gz::quantize::sign<false>>{});
  f(dense<gz::quantize::sign<true>>{});
  f(dense<gz::quantize::onebit<>>{});
  f(dense<gz::quantize::natural<8, 64>>{{}, gz::quantize::natural<8, 64>{5}});
  f(dense<gz::quantize::natural<9>>{{}, gz::quantize::natural<9>{5}});
}


#elif GRADZIP_FUZZ_TARGET == 3
using rk_none = gz::codec<gz::sparsify::randomk, gz::quantize::none, gz::encode::none>;
using rk_bf16 = gz::codec<gz::sparsify::randomk, gz::quantize::cast_bf16, gz::encode::none>;
using stochastic2 = gz::quantize::uniform<2, gz::quantize::rounding::stochastic, 64>;
using rk_u2 = gz::codec<gz::sparsify::randomk, stochastic2, gz::encode::none>;

template <class F>
void each_config(F f) {
  f(rk_none{gz::sparsify::randomk::ratio(0.1, 9)});
  f(rk_bf16{gz::sparsify::randomk::ratio(0.3, 9)});
  f(rk_u2{gz::sparsify::randomk::ratio(0.2, 9), stochastic2{4}});
}

#elif GRADZIP_FUZZ_TARGET == 4
const gz::sketch::count_sketch cs{3, 100, 9};
// A valid sketch of n elements costs a full estimate and top-k over n: sizes up to 1,024 reach
// every path at a few thousand inputs per second.
constexpr std::uint64_t sketch_limit = 1024;
enum entry : std::size_t { estimate, merge, unsketch, restore, step, entry_count };

void make_seeds() {
  gz::host exec(1);
  std::uint32_t salt = 0;
  for (std::size_t n : {1, 300, 1000}) {
    const auto g = sample_gradient(n, ++salt);
    std::vector<std::byte> table(cs.payload_bytes(n));
    cs.compress(exec, gz::span<const float>(g), gz::span<std::byte>(table));
    for (std::size_t which : {estimate, merge, unsketch, step}) push_selected(which, table);
    gz::sketch::fetchsgd fs{cs, n, 1, 0.5f};
    std::vector<std::byte> update(fs.max_update_bytes());
    fs.step(exec, gz::span<const std::byte>(table), gz::span<std::byte>(update), 1.0f, 0.1f);
    const auto state = fs.save(exec);
    push_selected(restore, state);
  }
}

void fuzz(bytes_t bytes) {
  gz::host exec(1);
  const auto [which, payload] = pick(bytes, entry_count);
  const std::size_t n = claimed_size(payload, sketch_limit);
  switch (which) {
    case estimate: {
      std::vector<float> estimates(n, 1.0f);
      attempt([&, payload = payload] { cs.estimate(exec, payload, gz::span<float>(estimates)); });
      break;
    }
    case merge: {
      std::vector<std::byte> into(cs.payload_bytes(n));
      const std::vector<float> zeros(n);
      cs.compress(exec, gz::span<const float>(zeros), gz::span<std::byte>(into));
      attempt([&, payload = payload] { cs.merge(exec, gz::span<std::byte>(into), payload); });
      break;
    }
    case unsketch: {
      if (n == 0) return;
      std::vector<std::byte> top(cs.max_unsketch_bytes(n, 1));
      attempt([&, payload = payload] { cs.unsketch(exec, payload, n, 1, gz::span<std::byte>(top)); });
      break;
    }
    default: {  // restore, step
      if (n == 0) return;
      gz::sketch::fetchsgd fs{cs, n, 1, 0.5f};
      std::vector<std::byte> update(fs.max_update_bytes());
      if (which == restore) attempt([&, payload = payload] { fs.restore(exec, payload); });
      else attempt([&, payload = payload] { fs.step(exec, payload, gz::span<std::byte>(update), 1.0f, 0.1f); });
    }
  }
}

#elif GRADZIP_FUZZ_TARGET == 5
using u4 = gz::codec<gz::sparsify::none, gz::quantize::uniform<4>, gz::encode::none>;
using top = gz::codec<gz::sparsify::topk>;
const gz::hash::simhash small_sh{64, 16, 9}, wide_sh{1024, 128, 1};
const gz::transform::rotated<u4> rot_u4{u4{}, gz::transform::hadamard{256, 5}};
const gz::transform::rotated<top> rot_top{top{gz::sparsify::topk::ratio(0.05)}, gz::transform::hadamard{64, 5}};

void make_seeds() {
  gz::host exec(1);
  std::uint32_t salt = 0;
  for (std::size_t n : {1, 300, 2000}) {
    const auto g = sample_gradient(n, ++salt);
    const auto add = [&](const auto& c) {
      std::vector<std::byte> out(c.template max_compressed_bytes<float>(n));
      out.resize(c.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out)));
      seeds.push_back(out);
    };
    add(small_sh);
    add(wide_sh);
    add(rot_u4);
    add(rot_top);
  }
}

void fuzz(bytes_t bytes) {
  gz::host exec(1);
  const std::size_t n = claimed_size(bytes);
  std::vector<float> accum(n, 1.0f);
  for (const auto* sh : {&small_sh, &wide_sh}) attempt([&] { sh->decompress_add(exec, bytes, gz::span<float>(accum)); });
  attempt([&] { rot_u4.decompress_add(exec, bytes, gz::span<float>(accum)); });
  attempt([&] { rot_top.decompress_add(exec, bytes, gz::span<float>(accum)); });
  attempt([&] { rot_top.decompress(exec, bytes, gz::span<float>(accum)); });
}

#elif GRADZIP_FUZZ_TARGET == 6
using top = gz::codec<gz::sparsify::topk>;
using sign_codec = gz::codec<gz::sparsify::none, gz::quantize::sign<false>, gz::encode::none>;

void make_seeds() {
  gz::host exec(1);
  std::uint32_t salt = 0;
  for (std::size_t n : {1, 64, 700}) {
    const auto g = sample_gradient(n, ++salt);
    gz::feedback::error_feedback<top, float, gz::host> ef(exec, top{gz::sparsify::topk::count(1)}, n);
    gz::feedback::momentum_correction<top, float, gz::host> mc(exec, top{gz::sparsify::topk::count(1)}, n, 0.5f);
    gz::feedback::signum<sign_codec, float, gz::host> sg(exec, sign_codec{}, n, 0.9f);
    std::vector<std::byte> out(mc.max_compressed_bytes<float>() + sg.max_compressed_bytes<float>());
    ef.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out));
    mc.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out));
    seeds.push_back(ef.save(exec));
    seeds.push_back(mc.save(exec));
    out.resize(sg.compress(exec, gz::span<const float>(g), gz::span<std::byte>(out)));
    seeds.push_back(sg.save(exec));
    seeds.push_back(out);  // a sign payload, for the vote
  }
}

void fuzz(bytes_t bytes) {
  gz::host exec(1);
  const std::size_t n = claimed_size(bytes);
  gz::feedback::error_feedback<top, float, gz::host> ef(exec, top{gz::sparsify::topk::count(1)}, n);
  attempt([&] { ef.restore(exec, bytes); });
  gz::feedback::momentum_correction<top, float, gz::host> mc(exec, top{gz::sparsify::topk::count(1)}, n, 0.5f);
  attempt([&] { mc.restore(exec, bytes); });
  gz::feedback::signum<sign_codec, float, gz::host> sg(exec, sign_codec{}, n, 0.9f);
  attempt([&] { sg.restore(exec, bytes); });
  // The vote over the bytes twice, and split in two at a point the bytes choose.
  std::vector<float> out(n, 42.0f);
  const std::size_t cut = bytes.empty() ? 0 : static_cast<std::size_t>(bytes[0]) * 16 % (bytes.size() + 1);
  const bytes_t votes[3] = {bytes, bytes.subspan(0, cut), bytes.subspan(cut, bytes.size() - cut)};
  attempt([&] { gz::quantize::majority_vote(exec, sign_codec{}, gz::span<const bytes_t>(votes, 3), gz::span<float>(out)); });
}

#elif GRADZIP_FUZZ_TARGET == 7
const gz::hash::partition zen{8, 11};

void make_seeds() {
  gz::host exec(1);
  for (std::uint64_t n : {64, 4096}) {
    const auto load = zen.loads(n);
    for (std::uint32_t p = 0; p < 8; ++p) {
      std::vector<std::uint64_t> members;  // every 7th index of part p
      for (std::uint64_t i = 0; i < n; i += 7) {
        if (zen.part_of(i) == p) members.push_back(i);
      }
      std::vector<std::uint64_t> bits((load[p] + 63) / 64);
      zen.encode_bitmap(p, n, gz::span<const std::uint64_t>(members), gz::span<std::uint64_t>(bits));
      std::vector<std::byte> seed(1 + bits.size() * 8);
      seed[0] = static_cast<std::byte>(p | (n > 64 ? 8 : 0));
      std::memcpy(seed.data() + 1, bits.data(), bits.size() * 8);
      seeds.push_back(seed);
    }
  }
}

void fuzz(bytes_t bytes) {
  if (bytes.empty()) return;
  // Byte 0: the part (low 3 bits) and n (bit 3: 4,096, else 64); the rest: the bitmap's words.
  const auto head = static_cast<std::uint32_t>(bytes[0]);
  const std::uint64_t n = head & 8 ? 4096 : 64;
  std::vector<std::uint64_t> words((bytes.size() - 1) / 8);
  if (!words.empty()) std::memcpy(words.data(), bytes.data() + 1, words.size() * 8);
  attempt([&] { (void)zen.decode_bitmap(head & 7, n, gz::span<const std::uint64_t>(words)); });
}
#elif GRADZIP_FUZZ_TARGET == 8
// Byte 0 picks the entry point (mod 6); the rest is what arrives.
const std::vector<std::vector<std::size_t>> buckets{{12, 20}, {12}};

gz::lowrank::powersgd_params powersgd_params() {
  gz::lowrank::powersgd_params p;
  p.rank = 2;
  return p;
}

/// Two ranks seen from rank 0: rank 1's every contribution is `theirs`.
class replaying_communicator final : public gz::comm::communicator {
 public:
  explicit replaying_communicator(bytes_t theirs) : theirs_(theirs) {}
  int rank() const override { return 0; }
  int size() const override { return 2; }
  void allreduce_sum(void*, std::size_t, gz::element_type) override {}
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override {
    sizes[0] = mine;
    // A verdict (0, or the top bit set; a payload is never empty) is rank 1's "all well", so
    // that the apply paths after the verdict are reached; a size is the input's.
    sizes[1] = mine == 0 || mine >> 63 != 0 ? 0 : theirs_.size();
  }
  void allgatherv_bytes(bytes_t mine, gz::span<std::byte> all, gz::span<const std::uint64_t>) override {
    copy(all.data(), mine);
    copy(all.data() + mine.size(), theirs_);
  }
  void alltoall_sizes(gz::span<const std::uint64_t> mine, gz::span<std::uint64_t> theirs) override {
    theirs[0] = mine[0];
    theirs[1] = theirs_.size();
  }
  void alltoallv_bytes(bytes_t send, gz::span<const std::uint64_t> send_sizes, gz::span<std::byte> recv,
                       gz::span<const std::uint64_t>) override {
    copy(recv.data(), send.subspan(0, send_sizes[0]));
    copy(recv.data() + send_sizes[0], theirs_);
  }

 private:
  static void copy(std::byte* to, bytes_t from) {
    if (!from.empty()) std::memcpy(to, from.data(), from.size());
  }
  bytes_t theirs_;
};

constexpr gz::comm::sparse_scheme zen_schemes[3] = {gz::comm::sparse_scheme::balanced_parallelism,
                                                   gz::comm::sparse_scheme::hierarchical_centralization,
                                                   gz::comm::sparse_scheme::allgather};
constexpr std::uint64_t zen_n = 300;

/// Rank 1's side of one exchange, captured by a communicator that plays rank 1 and keeps what
/// it is handed.
class recording_communicator final : public gz::comm::communicator {
 public:
  int rank() const override { return 1; }
  int size() const override { return 2; }
  void allreduce_sum(void*, std::size_t, gz::element_type) override {}
  void allgather_sizes(std::uint64_t mine, gz::span<std::uint64_t> sizes) override {
    sizes[0] = 0;
    sizes[1] = mine;
  }
  void allgatherv_bytes(bytes_t mine, gz::span<std::byte> all, gz::span<const std::uint64_t>) override {
    record(mine);
    if (!mine.empty()) std::memcpy(all.data(), mine.data(), mine.size());
  }
  void alltoall_sizes(gz::span<const std::uint64_t> mine, gz::span<std::uint64_t> theirs) override {
    theirs[0] = 0;
    theirs[1] = mine[1];
  }
  void alltoallv_bytes(bytes_t send, gz::span<const std::uint64_t> send_sizes, gz::span<std::byte> recv,
                       gz::span<const std::uint64_t>) override {
    record(send.subspan(0, send_sizes[0]));  // the part for rank 0
    if (send_sizes[1] != 0) std::memcpy(recv.data(), send.data() + send_sizes[0], send_sizes[1]);
  }
  std::vector<std::vector<std::byte>> recorded;

 private:
  void record(bytes_t b) {
    if (!b.empty()) recorded.emplace_back(b.begin(), b.end());
  }
};

void make_seeds() {
  gz::host exec(1);
  gz::lowrank::powersgd<float, gz::host> ps(exec, buckets, powersgd_params());
  const auto g = sample_gradient(ps.size(), 5);
  std::vector<std::byte> p(ps.payload_bytes(gz::lowrank::factor::p)), q(ps.payload_bytes(gz::lowrank::factor::q));
  std::vector<float> out = g;
  ps.compress_p(exec, gz::span<const float>(g), gz::span<std::byte>(p));
  ps.compress_q(exec, bytes_t(p), gz::span<std::byte>(q));
  ps.decompress(exec, bytes_t(q), 1, gz::span<float>(out));
  push_selected(0, bytes_t(p));
  push_selected(1, bytes_t(q));
  const std::vector<std::byte> state = ps.save(exec);
  push_selected(2, bytes_t(state));
  // What rank 1 sends in each scheme (a part, a reduced part, a stage, a whole payload); the
  // replay below cannot produce rank 1's answers, so these seed the shapes, and mutation the rest.
  std::vector<std::uint64_t> idx;
  std::vector<float> val;
  for (std::uint64_t i = 1; i < zen_n; i += 3) {
    idx.push_back(i);
    val.push_back(static_cast<float>(i) * 0.5f);
  }
  for (int s = 0; s < 3; ++s) {
    recording_communicator rank1;
    gz::comm::sparse_sync zen(zen_n, 2, 9);
    std::vector<float> sink(zen_n);
    attempt([&] {
      zen.run(rank1, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(sink), 1.0f,
              zen_schemes[s]);
    });
    for (const auto& b : rank1.recorded) push_selected(static_cast<std::size_t>(3 + s), bytes_t(b));
  }
}

void fuzz(bytes_t bytes) {
  if (bytes.empty()) return;
  const unsigned which = static_cast<unsigned>(bytes[0]) % 6;
  bytes = bytes.subspan(1, bytes.size() - 1);
  gz::host exec(1);
  if (which < 3) {
    gz::lowrank::powersgd<float, gz::host> ps(exec, buckets, powersgd_params());
    std::vector<float> g(ps.size(), 0.5f);
    std::vector<std::byte> p(ps.payload_bytes(gz::lowrank::factor::p)), q(ps.payload_bytes(gz::lowrank::factor::q));
    if (which == 2) {
      attempt([&] { ps.restore(exec, bytes); });
      return;
    }
    ps.compress_p(exec, gz::span<const float>(g), gz::span<std::byte>(p));
    if (which == 0) {
      attempt([&] { ps.compress_q(exec, bytes, gz::span<std::byte>(q)); });
      return;
    }
    ps.compress_q(exec, bytes_t(p), gz::span<std::byte>(q));
    attempt([&] { ps.decompress(exec, bytes, 2, gz::span<float>(g)); });
    return;
  }
  replaying_communicator comm(bytes);
  gz::comm::sparse_sync zen(zen_n, 2, 9);
  std::vector<std::uint64_t> idx{0, 5, 77, 299};
  std::vector<float> val{1.0f, -2.0f, 3.0f, 4.0f}, out(zen_n, 0.0f);
  attempt([&] {
    zen.run(comm, exec, gz::span<const std::uint64_t>(idx), gz::span<const float>(val), gz::span<float>(out), 0.5f,
            zen_schemes[which - 3]);
  });
}
#else
#error "define GRADZIP_FUZZ_TARGET as 1..8"
#endif

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  const char* dir = std::getenv("GRADZIP_FUZZ_SEEDS");
  if (dir == nullptr) return 0;
  make_seeds();
  for (std::size_t i = 0; i < seeds.size(); ++i) {
    const std::string path = std::string(dir) + "/seed_" + std::to_string(i);
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (f == nullptr || std::fwrite(seeds[i].data(), 1, seeds[i].size(), f) != seeds[i].size()) std::abort();
    std::fclose(f);
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  fuzz(bytes_t(reinterpret_cast<const std::byte*>(data), size));
  return 0;
}
