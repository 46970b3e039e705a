// The host executor's pool (detail/host/chunk_pool.hpp): every chunk runs exactly once, whoever
// runs it, with concurrent callers and with calls from inside a chunk.
#include <atomic>
#include <catch2/catch.hpp>
#include <thread>
#include <vector>

#include "gradzip/detail/host/chunk_pool.hpp"
#include "gradzip/detail/host/parallel.hpp"

namespace gz = gradzip;
using gradzip::detail::chunk_pool;

namespace {

/// Runs `chunks` chunks on `threads` threads and returns how often each chunk ran.
std::vector<int> run_counts(int threads, std::size_t chunks) {
  std::vector<std::atomic<int>> ran(chunks);
  for (auto& r : ran) r.store(0);
  auto body = [&](std::size_t c) { ran[c].fetch_add(1); };
  chunk_pool::instance().run(threads, chunks,
                             [](void* context, std::size_t c) noexcept { (*static_cast<decltype(body)*>(context))(c); },
                             &body);
  std::vector<int> counts;
  for (auto& r : ran) counts.push_back(r.load());
  return counts;
}

}  // namespace

TEST_CASE("chunk_pool runs every chunk exactly once", "[host][pool]") {
  for (int threads : {1, 2, 3, 8}) {
    for (std::size_t chunks : {0u, 1u, 2u, 3u, 7u, 1000u}) {
      INFO("threads " << threads << ", chunks " << chunks);
      for (int repeat = 0; repeat < 20; ++repeat) {
        const auto counts = run_counts(threads, chunks);
        REQUIRE(counts == std::vector<int>(chunks, 1));
      }
    }
  }
}

TEST_CASE("chunk_pool: concurrent callers and nested calls each run all their chunks", "[host][pool]") {
  std::atomic<int> failures{0};
  std::vector<std::thread> callers;
  for (int t = 0; t < 4; ++t) {
    callers.emplace_back([&failures, t] {
      for (int call = 0; call < 200; ++call) {
        const std::size_t chunks = 1 + static_cast<std::size_t>((call * 7 + t) % 13);
        if (run_counts(2 + t % 3, chunks) != std::vector<int>(chunks, 1)) failures.fetch_add(1);
      }
    });
  }
  for (auto& c : callers) c.join();
  CHECK(failures.load() == 0);

  // A chunk that itself runs chunks: the inner call finds the pool held and runs serially.
  std::vector<std::atomic<int>> inner(4 * 5);
  for (auto& r : inner) r.store(0);
  gz::host exec{4};
  gz::detail::for_each_chunk(exec, 4, [&](std::size_t outer) {
    gz::detail::for_each_chunk(exec, 5, [&](std::size_t c) { inner[outer * 5 + c].fetch_add(1); });
  });
  for (auto& r : inner) CHECK(r.load() == 1);
}
