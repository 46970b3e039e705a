// The host executor's threads: a pool of sleeping helpers that the calling thread never waits
// for unless they already hold work.
//
// Why not `#pragma omp parallel`: an OpenMP region ends at a barrier that waits for every thread
// of the team. When another process holds one of the cores, the team's thread on that core runs
// only when the scheduler gives it a slice, so a 0.4 ms call could take 4 ms or more (a time
// slice), and the spinning that OpenMP does between regions (its default wait policy) makes the
// busy core busier. Here the caller claims chunks itself, helpers claim what is left when they
// wake, and the caller waits only for chunks a helper has claimed. A helper that wakes late finds
// nothing left and sleeps again; under contention a call degrades to its one-thread time, never to
// a scheduler slice (docs/performance.md, "Host threads under contention").
//
// Results do not change: every algorithm combines per-chunk results by chunk index, and which
// thread runs a chunk is not observable. Helpers wait on a condition variable (passive), are
// created on first use, and are never joined: the pool lives until the process exits. After a
// job a helper polls for the next one for `linger` (yielding the core at each look) before it
// sleeps: calls that follow each other closely (a decode's validation and scatter, a fused
// compressor's groups) then find it awake instead of paying a wake-up each.
#pragma once

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <chrono>
#include <mutex>
#include <thread>

namespace gradzip::detail {

class chunk_pool {
 public:
  using chunk_function = void (*)(void* context, std::size_t chunk) noexcept;

  /// The process-wide pool (never destroyed: helpers may still sleep in it at exit).
  static chunk_pool& instance() {
    static chunk_pool* pool = new chunk_pool;
    return *pool;
  }

  /// Runs f(context, c) for every c in [0, chunks) on the caller and up to threads - 1 helpers.
  /// When another call holds the pool (another thread, or a call from inside a chunk), the
  /// caller runs every chunk itself: concurrent callers never wait for each other.
  void run(int threads, std::size_t chunks, chunk_function f, void* context) {
    if (threads <= 1 || chunks <= 1 || chunks > max_chunks || busy_.exchange(true, std::memory_order_acquire)) {
      for (std::size_t c = 0; c < chunks; ++c) f(context, c);
      return;
    }
    int helpers = static_cast<int>(std::min<std::size_t>(static_cast<std::size_t>(threads) - 1, chunks - 1));
    std::uint64_t generation = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      try {
        for (; started_ < helpers; ++started_) {
          const int index = started_;
          std::thread([this, index] { serve(index); }).detach();
        }
      } catch (...) {  // no more threads to be had: the ones there are (or the caller) do it all
        helpers = started_;
      }
      generation = ++generation_;
      job_ = {f, context, chunks, helpers};
      done_.store(0, std::memory_order_relaxed);
      claim_.store(tagged(generation, 0), std::memory_order_release);
      published_.store(generation, std::memory_order_release);
    }
    wake_.notify_all();
    work(generation, job_);
    // Wait only for chunks that helpers claimed and are running.
    while (done_.load(std::memory_order_acquire) < chunks) std::this_thread::yield();
    busy_.store(false, std::memory_order_release);
  }

 private:
  struct job {
    chunk_function f = nullptr;
    void* context = nullptr;
    std::size_t chunks = 0;
    int helpers = 0;
  };

  static constexpr std::size_t max_chunks = 0xFFFFFFFFu;

  /// The next chunk to claim, tagged with the low 32 bits of its call's generation, so that a
  /// helper holding an older call's job can never claim a chunk of the current one.
  static std::uint64_t tagged(std::uint64_t generation, std::uint64_t chunk) { return (generation << 32) | chunk; }

  void work(std::uint64_t generation, const job& j) {
    for (;;) {
      std::uint64_t claim = claim_.load(std::memory_order_acquire);
      std::size_t chunk = 0;
      for (;;) {
        chunk = static_cast<std::size_t>(claim & 0xFFFFFFFFu);
        if ((claim >> 32) != (generation & 0xFFFFFFFFu) || chunk >= j.chunks) return;
        if (claim_.compare_exchange_weak(claim, claim + 1, std::memory_order_acq_rel)) break;
      }
      j.f(j.context, chunk);
      done_.fetch_add(1, std::memory_order_release);
    }
  }

  /// How long a helper polls for the next job before it sleeps.
  static constexpr std::chrono::microseconds linger{100};

  [[noreturn]] void serve(int index) {
    std::uint64_t seen = 0;
    for (;;) {
      const auto until = std::chrono::steady_clock::now() + linger;
      while (published_.load(std::memory_order_acquire) == seen && std::chrono::steady_clock::now() < until) {
        std::this_thread::yield();
      }
      job mine;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
        mine = job_;
      }
      if (index < mine.helpers) work(seen, mine);
    }
  }

  std::atomic<bool> busy_{false};  // set by the call that owns the helpers (not a mutex: a
                                   // chunk's own call must fail to take it, not deadlock)
  std::mutex mutex_;  // guards generation_, job_ and started_
  std::condition_variable wake_;
  std::uint64_t generation_ = 0;
  std::atomic<std::uint64_t> published_{0};  // generation_, for helpers that poll without the mutex
  job job_;
  int started_ = 0;  // helpers started (detached), numbered 0 .. started_ - 1
  std::atomic<std::uint64_t> claim_{0};
  std::atomic<std::size_t> done_{0};
};

}  // namespace gradzip::detail
