// An in-process "job" for collective tests: P threads, one per rank, each with a communicator
// that shares its buffers with the others behind a barrier (host memory). It can damage one
// rank's bytes on their way, to test that a receiver names the sender.
#pragma once

#include <catch2/catch.hpp>

#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "gradzip/comm/collective.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/random/hash.hpp"
#include "common/synthetic_gradient.hpp"

namespace gradzip_test {

using namespace gradzip;

/// A broken expectation of the harness itself, on a rank's thread: Catch's assertions are not
/// thread-safe (ThreadSanitizer reports them), and an exception would leave the other ranks
/// waiting at the next barrier, so it stops the process with the message.
inline void harness_expects(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "thread_communicator: %s\n", what);
  std::abort();
}

#define GRADZIP_TEST_STRING_(x) #x
#define GRADZIP_TEST_STRING(x) GRADZIP_TEST_STRING_(x)
#define GRADZIP_TEST_WHERE __FILE__ ":" GRADZIP_TEST_STRING(__LINE__) ": "

/// CHECK(expression) inside an on_ranks body: a failure is reported, with the rank, file and
/// line, on the test's thread once the ranks finish. Returns whether it held.
#define RANK_CHECK(...) ::gradzip_test::rank_check(static_cast<bool>(__VA_ARGS__), GRADZIP_TEST_WHERE #__VA_ARGS__)

/// CHECK_THROWS_WITH(expression, Catch::Contains(text)) inside an on_ranks body. The message is
/// compared in double quotes, so a text that starts and ends with \" must match it whole.
#define RANK_CHECK_THROWS_WITH(expression, text) \
  ::gradzip_test::rank_check_throws_with([&] { static_cast<void>(expression); }, text, GRADZIP_TEST_WHERE #expression)

/// What the ranks of one in-process "job" share.
struct shared_state {
  explicit shared_state(int ranks) : ranks(ranks), slots(static_cast<std::size_t>(ranks)) {}
  int ranks;
  std::mutex mutex;
  std::condition_variable turn;
  int arrived = 0;
  std::uint64_t generation = 0;
  std::vector<std::vector<std::byte>> slots;  // each rank's contribution to the current collective

  void barrier() {
    std::unique_lock<std::mutex> lock(mutex);
    const std::uint64_t mine = generation;
    if (++arrived == ranks) {
      arrived = 0;
      ++generation;
      turn.notify_all();
    } else {
      turn.wait(lock, [&] { return generation != mine; });
    }
  }
};

class thread_communicator final : public comm::communicator {
 public:
  /// `exchange`: whether alltoall_sizes and alltoallv_bytes are this class's own (else the
  /// communicator base's defaults, built on the three required collectives, run).
  /// `corrupt_from`: the rank whose bytes arrive damaged (their first byte), in allgatherv_bytes,
  /// or in alltoallv_bytes when `corrupt_exchange`.
  /// `corrupt_at`: the only rank that receives them damaged (-1: every rank).
  thread_communicator(shared_state& s, int rank, int corrupt_from = -1, bool exchange = true,
                      bool corrupt_exchange = false, int corrupt_at = -1)
      : s_(s), rank_(rank), corrupt_(corrupt_from), exchange_(exchange), corrupt_exchange_(corrupt_exchange),
        corrupt_at_(corrupt_at) {}
  int rank() const override { return rank_; }
  int size() const override { return s_.ranks; }

  void allreduce_sum(void* data, std::size_t count, element_type type) override {
    if (type == element_type::f64) {  // auto_sparse_sync's profile
      publish(data, count * 8);
      std::vector<double> sum(count, 0.0);
      for (const auto& slot : s_.slots) {
        for (std::size_t i = 0; i < count; ++i) {
          double v;
          std::memcpy(&v, slot.data() + 8 * i, 8);
          sum[i] += v;
        }
      }
      s_.barrier();
      std::memcpy(data, sum.data(), count * 8);
      return;
    }
    harness_expects(type == element_type::f32 || type == element_type::bf16, "allreduce_sum of an unsupported type");
    const std::size_t width = type == element_type::f32 ? 4 : 2;
    publish(data, count * width);
    std::vector<float> sum(count, 0.0f);
    for (const auto& slot : s_.slots) {  // rank order, in float: every rank gets the same bits
      for (std::size_t i = 0; i < count; ++i) sum[i] += load(slot.data(), type, i);
    }
    s_.barrier();
    for (std::size_t i = 0; i < count; ++i) {
      if (type == element_type::f32) {
        std::memcpy(static_cast<std::byte*>(data) + 4 * i, &sum[i], 4);
      } else {  // rounded to bf16 as the MPI adapter's custom sum does
        const std::uint16_t b = quantize::float_to_bf16_bits(sum[i]);
        std::memcpy(static_cast<std::byte*>(data) + 2 * i, &b, 2);
      }
    }
  }

  void alltoall_sizes(span<const std::uint64_t> mine, span<std::uint64_t> theirs) override {
    if (!exchange_) return communicator::alltoall_sizes(mine, theirs);
    publish(mine.data(), mine.size() * 8);
    for (int r = 0; r < s_.ranks; ++r) std::memcpy(&theirs[static_cast<std::size_t>(r)], s_.slots[r].data() + 8 * rank_, 8);
    s_.barrier();
  }

  void alltoallv_bytes(span<const std::byte> send, span<const std::uint64_t> send_sizes, span<std::byte> recv,
                       span<const std::uint64_t> recv_sizes) override {
    if (!exchange_) return communicator::alltoallv_bytes(send, send_sizes, recv, recv_sizes);
    comm::detail::check_alltoallv(send, send_sizes, recv, recv_sizes, static_cast<std::size_t>(s_.ranks), "alltoallv_bytes");
    // Publish the sizes, then the bytes; read this rank's part of every rank's bytes.
    publish(send_sizes.data(), send_sizes.size() * 8);
    std::vector<std::uint64_t> starts(static_cast<std::size_t>(s_.ranks));
    for (int r = 0; r < s_.ranks; ++r) {
      std::uint64_t at = 0;
      for (int p = 0; p < rank_; ++p) {
        std::uint64_t size;
        std::memcpy(&size, s_.slots[r].data() + 8 * p, 8);
        at += size;
      }
      starts[static_cast<std::size_t>(r)] = at;
    }
    publish(send.data(), send.size());
    std::size_t out = 0;
    for (int r = 0; r < s_.ranks; ++r) {
      const std::uint64_t size = recv_sizes[static_cast<std::size_t>(r)];
      harness_expects(starts[static_cast<std::size_t>(r)] + size <= s_.slots[r].size(),
                      "alltoallv_bytes: a rank expects more bytes than the sender sent it");
      if (size != 0) std::memcpy(recv.data() + out, s_.slots[r].data() + starts[static_cast<std::size_t>(r)], size);
      if (corrupt_exchange_ && r == corrupt_ && size != 0 && damaged_here()) recv[out] ^= std::byte{0xFF};
      out += size;
    }
    s_.barrier();
  }

  static float load(const std::byte* p, element_type type, std::size_t i) {
    if (type == element_type::f32) {
      float v;
      std::memcpy(&v, p + 4 * i, 4);
      return v;
    }
    std::uint16_t b;
    std::memcpy(&b, p + 2 * i, 2);
    const std::uint32_t bits = static_cast<std::uint32_t>(b) << 16;
    float v;
    std::memcpy(&v, &bits, 4);
    return v;
  }

  void allgather_sizes(std::uint64_t mine, span<std::uint64_t> sizes) override {
    publish(&mine, 8);
    for (int r = 0; r < s_.ranks; ++r) std::memcpy(&sizes[static_cast<std::size_t>(r)], s_.slots[r].data(), 8);
    s_.barrier();
  }

  void allgatherv_bytes(span<const std::byte> mine, span<std::byte> all, span<const std::uint64_t> sizes) override {
    publish(mine.data(), mine.size());
    std::size_t at = 0;
    for (int r = 0; r < s_.ranks; ++r) {
      harness_expects(s_.slots[r].size() == sizes[static_cast<std::size_t>(r)],
                      "allgatherv_bytes: a rank's size is not what it sent");
      if (!s_.slots[r].empty()) std::memcpy(all.data() + at, s_.slots[r].data(), s_.slots[r].size());
      if (!corrupt_exchange_ && r == corrupt_ && damaged_here()) all[at] ^= std::byte{0xFF};  // its magic, damaged
      at += s_.slots[r].size();
    }
    s_.barrier();
  }

 private:
  void publish(const void* data, std::size_t bytes) {
    s_.barrier();  // everyone finished reading the previous collective
    s_.slots[rank_].assign(static_cast<const std::byte*>(data), static_cast<const std::byte*>(data) + bytes);
    s_.barrier();  // every slot written
  }

  shared_state& s_;
  int rank_;
  bool damaged_here() const { return corrupt_at_ < 0 || corrupt_at_ == rank_; }

  int corrupt_;
  bool exchange_;
  bool corrupt_exchange_;
  int corrupt_at_;
};

/// Failed checks of the calling rank's thread, in an on_ranks body (null elsewhere).
inline thread_local std::vector<std::string>* rank_failures = nullptr;

/// RANK_CHECK's work: notes `what` for the calling rank when ok is false; returns ok.
inline bool rank_check(bool ok, const char* what) {
  harness_expects(rank_failures != nullptr, "RANK_CHECK outside an on_ranks body");
  if (!ok) rank_failures->push_back(what);
  return ok;
}

/// RANK_CHECK_THROWS_WITH's work: f() must throw a std::exception whose message contains `text`.
template <class F>
void rank_check_throws_with(F&& f, const std::string& text, const char* what) {
  std::string thrown = "nothing";
  try {
    f();
  } catch (const std::exception& e) {
    thrown = std::string("\"") + e.what() + "\"";
    if (thrown.find(text) != std::string::npos) return;
  }
  rank_check(false, (std::string(what) + " threw " + thrown + ", which does not contain \"" + text + "\"").c_str());
}

/// Runs body(rank, communicator) on `ranks` threads; returns each rank's exception message ("" if none).
/// Checks inside the body use RANK_CHECK and RANK_CHECK_THROWS_WITH, never Catch's assertions:
/// Catch 2's are not thread-safe, and a REQUIRE that throws on one rank leaves the others waiting
/// at their next collective. Their failures are reported here, on the test's thread.
inline std::vector<std::string> on_ranks(int ranks, int corrupt_from, const std::function<void(int, comm::communicator&)>& body,
                                  bool exchange = true, bool corrupt_exchange = false, int corrupt_at = -1) {
  shared_state s(ranks);
  std::vector<std::string> errors(static_cast<std::size_t>(ranks));
  std::vector<std::vector<std::string>> failures(static_cast<std::size_t>(ranks));
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r) {
    threads.emplace_back([&, r] {
      rank_failures = &failures[static_cast<std::size_t>(r)];
      thread_communicator c(s, r, corrupt_from, exchange, corrupt_exchange, corrupt_at);
      try {
        body(r, c);
      } catch (const std::exception& e) {
        errors[static_cast<std::size_t>(r)] = e.what();
      }
      rank_failures = nullptr;
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < ranks; ++r) {
    for (const auto& f : failures[static_cast<std::size_t>(r)]) FAIL_CHECK("rank " << r << ": " << f);
  }
  return errors;
}

/// Rank r's nonzeros: a shared hot set (indices below n / 20, each with probability 1/2; none
/// without `hot`) and its own cold ones (density `density` over the rest), values from the
/// synthetic gradient.
inline void sparse_gradient(int r, std::uint64_t n, double density, std::vector<std::uint64_t>& idx, std::vector<float>& val,
                            bool hot = true) {
  idx.clear();
  val.clear();
  const auto v = gradzip_tools::synthetic_gradient<float>(static_cast<std::size_t>(n), 700 + r);
  for (std::uint64_t i = 0; i < n; ++i) {
    const std::uint64_t h = hash64(31 + static_cast<std::uint64_t>(r), i);
    const bool keep = hot && i < n / 20 ? (h & 1) != 0 : static_cast<double>(h >> 11) / 9007199254740992.0 < density;
    if (keep) {
      idx.push_back(i);
      val.push_back(v[i]);
    }
  }
}

}  // namespace gradzip_test
