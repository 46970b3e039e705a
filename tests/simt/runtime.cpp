// gradzip's CPU SIMT backend: fibers, the block scheduler, and the CUDA runtime API the library
// calls, executed on the CPU. See gradzip_simt/device.hpp for what device code sees, and
// docs/architecture.md ("Device code without a GPU") for the semantics and their limits.
//
// Streams are lazy: work waits in its stream's queue until the host needs it (a synchronize, a
// blocking copy, an event wait) or another stream's work depends on it. That is a legal CUDA
// schedule, and the one most likely to expose a missing dependency: work on two streams with
// no event between them runs in whatever order the host's waits pull it.
#include <cuda_runtime.h>
#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>
#include <vector>

#include "gradzip_simt/device.hpp"
#include "gradzip_simt/settings.hpp"

#if defined(GRADZIP_SIMT_ASAN)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif
#if defined(GRADZIP_SIMT_TSAN)
#include <sanitizer/tsan_interface.h>
extern "C" {
void __tsan_ignore_thread_begin();
void __tsan_ignore_thread_end();
}
#endif
#if !defined(__x86_64__)
#include <ucontext.h>
#endif

namespace gradzip_simt {

thread_local thread_context* current = nullptr;

settings& config() {
  static settings s;
  return s;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Fibers
// ---------------------------------------------------------------------------------------------

#if defined(GRADZIP_SIMT_ASAN) || defined(GRADZIP_SIMT_TSAN)
constexpr std::size_t stack_bytes = std::size_t{1} << 20;  // a sanitizer's frames are several times larger
#else
constexpr std::size_t stack_bytes = std::size_t{256} << 10;
#endif

/// A fiber stack with a guard page below it; mapped once, reused by every block.
struct fiber_stack {
  char* base = nullptr;  // the guard page
  char* low = nullptr;
  std::size_t size = 0;
  bool clean = true;  // the last fiber on it returned from every frame but its outermost ones
  /// The stack of the pool's thread `index` (for the message if it cannot be mapped).
  explicit fiber_stack(std::size_t index) {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* p = mmap(nullptr, stack_bytes + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE,
                   -1, 0);
    // Each stack is two mappings (the guard page and the stack), and a cooperative launch holds
    // every thread of its grid at once: 2 x blocks x threads of them, against the kernel's
    // vm.max_map_count (65,530 by default, about 32,000 threads).
    if (p == MAP_FAILED || mprotect(p, page, PROT_NONE) != 0) {
      const int error = errno;
      std::fprintf(stderr,
                   "gradzip SIMT: cannot map the stack of fiber %zu (%s). Each fiber stack is two memory "
                   "mappings and every thread of a cooperative grid holds one at once: see "
                   "/proc/sys/vm/max_map_count and ulimit -v, or emulate a smaller device (--simt-sm-count, "
                   "--simt-blocks-per-sm, --simt-max-cooperative)\n",
                   index, std::strerror(error));
      std::abort();
    }
    base = static_cast<char*>(p);
    low = base + page;
    size = stack_bytes;
#if defined(GRADZIP_SIMT_TSAN)
    tsan_fiber = __tsan_create_fiber(0);
#endif
  }
  fiber_stack(const fiber_stack&) = delete;
  fiber_stack& operator=(const fiber_stack&) = delete;
  ~fiber_stack() {
#if defined(GRADZIP_SIMT_TSAN)
    __tsan_destroy_fiber(tsan_fiber);
#endif
    munmap(base, size + static_cast<std::size_t>(sysconf(_SC_PAGESIZE)));
  }
#if defined(GRADZIP_SIMT_TSAN)
  // ThreadSanitizer's thread for every CUDA thread that runs on this stack: the same one each
  // time, so that its shadow stack and history stay one thread's.
  void* tsan_fiber = nullptr;
#endif
};

enum class fiber_state : std::uint8_t { runnable, waiting, exited };

struct fiber {
  thread_context ctx;
  fiber_state state = fiber_state::runnable;
  void* sp = nullptr;
  fiber_stack* stack = nullptr;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
#if defined(GRADZIP_SIMT_ASAN)
  void* fake_stack = nullptr;
#endif
};

}  // namespace
}  // namespace gradzip_simt

#if defined(__x86_64__)
// Saves the callee-saved registers, MXCSR and the x87 control word on the current stack,
// stores the stack pointer in *from and continues on `to`'s stack, popping the same.
extern "C" void gradzip_simt_switch(void** from, void* to);
asm(R"(
  .text
  .globl gradzip_simt_switch
  .type gradzip_simt_switch,@function
gradzip_simt_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size gradzip_simt_switch, .-gradzip_simt_switch
)");
#endif

namespace gradzip_simt {
namespace {

struct block_run;

/// The scheduler's side of the switch, and the fiber running now.
struct scheduler_context {
  void* sp = nullptr;
#if !defined(__x86_64__)
  ucontext_t uc;
#endif
#if defined(GRADZIP_SIMT_ASAN)
  void* fake_stack = nullptr;
  const void* stack_bottom = nullptr;
  std::size_t stack_size = 0;
#endif
  fiber* running = nullptr;
  block_run* block = nullptr;
#if defined(GRADZIP_SIMT_TSAN)
  void* tsan_thread = nullptr;  // ThreadSanitizer's context of the scheduler's OS thread
#endif
};
thread_local scheduler_context sched;

// ThreadSanitizer's view (the TSan build). Every CUDA thread runs on a TSan fiber of its own, and
// a switch between fibers orders nothing. What orders two threads is what orders them on a GPU:
// a __syncthreads or block collective (every arrival before every departure), a warp operation
// (among the lanes it joined), a grid_sync; and the end of a block or launch before the start of
// the next, since blocks run one after another here (in a cooperative launch, each block's turn
// after the others' earlier turns: begin_turn), so TSan sees no race between blocks. Two threads
// of a block that touch one word with no barrier between them, at least one writing and not both
// atomically, are a race that TSan reports. The
// scheduler's own accesses (poison, what threads post at a sync point, CUB collectives it runs
// for them) are the hardware's: TSan ignores them.
#if defined(GRADZIP_SIMT_TSAN)
void order_release(const void* key) { __tsan_release(const_cast<void*>(key)); }
void order_acquire(const void* key) { __tsan_acquire(const_cast<void*>(key)); }
#else
void order_release(const void*) {}
void order_acquire(const void*) {}
#endif
// A block's threads start after what the scheduler did before the block (the host's work, the
// earlier blocks) and end before what it does after. Two keys: a thread starts when first
// resumed, after other threads of its block may have ended.
char block_start;
char block_end;
char grid_keys[2];              // a cooperative launch's grid_sync, by round
std::uint64_t grid_rounds = 0;  // grid_syncs released

/// Between two blocks run one after the other: the first's threads before the second's.
void order_blocks() {
  order_acquire(&block_end);
  order_release(&block_start);
}

/// For the scope of a launch: the scheduler's accesses ignored, and ordered after the host's
/// earlier work and before its later work.
struct scheduler_scope {
  scheduler_scope() {
#if defined(GRADZIP_SIMT_TSAN)
    __tsan_ignore_thread_begin();
#endif
    order_release(&block_start);
  }
  ~scheduler_scope() {
    order_acquire(&block_end);
#if defined(GRADZIP_SIMT_TSAN)
    __tsan_ignore_thread_end();
#endif
  }
  scheduler_scope(const scheduler_scope&) = delete;
  scheduler_scope& operator=(const scheduler_scope&) = delete;
};

void fiber_main();

#if defined(__x86_64__)
[[noreturn]] void fiber_entry() {
  fiber_main();
  __builtin_unreachable();
}
#else
void fiber_entry() { fiber_main(); }
#endif

void prepare(fiber& f) {
#if defined(GRADZIP_SIMT_ASAN)
  // A finished fiber leaves ASan's poison only in its outermost frames (fiber_main's, which
  // switched away instead of returning); one abandoned by a fault leaves it anywhere.
  constexpr std::size_t outermost = 64 << 10;
  if (f.stack->clean) {
    __asan_unpoison_memory_region(f.stack->low + f.stack->size - outermost, outermost);
  } else {
    __asan_unpoison_memory_region(f.stack->low, f.stack->size);
  }
  f.fake_stack = nullptr;
#endif
  f.stack->clean = false;
#if defined(__x86_64__)
  auto** p = reinterpret_cast<void**>(f.stack->low + f.stack->size);
  *--p = nullptr;                                      // keeps the entry's stack 16-byte aligned
  *--p = reinterpret_cast<void*>(&fiber_entry);        // where the first switch returns to
  for (int r = 0; r < 6; ++r) *--p = nullptr;          // rbp rbx r12 r13 r14 r15
  *--p = reinterpret_cast<void*>(std::uintptr_t{0x037F00001F80});  // x87 control word, MXCSR
  f.sp = p;
#else
  getcontext(&f.uc);
  f.uc.uc_stack.ss_sp = f.stack->low;
  f.uc.uc_stack.ss_size = f.stack->size;
  f.uc.uc_link = nullptr;
  makecontext(&f.uc, fiber_entry, 0);
#endif
}

/// Scheduler -> fiber; returns when the fiber waits or exits.
void resume(fiber& f) {
  sched.running = &f;
  current = &f.ctx;
#if defined(GRADZIP_SIMT_ASAN)
  __sanitizer_start_switch_fiber(&sched.fake_stack, f.stack->low, f.stack->size);
#endif
#if defined(GRADZIP_SIMT_TSAN)
  sched.tsan_thread = __tsan_get_current_fiber();
  __tsan_switch_to_fiber(f.stack->tsan_fiber, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  gradzip_simt_switch(&sched.sp, f.sp);
#else
  swapcontext(&sched.uc, &f.uc);
#endif
#if defined(GRADZIP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(sched.fake_stack, nullptr, nullptr);
#endif
  current = nullptr;
  sched.running = nullptr;
}

/// Fiber -> scheduler; returns when the scheduler resumes this fiber.
void yield_to_scheduler(fiber& f, bool exiting) {
#if defined(GRADZIP_SIMT_ASAN)
  __sanitizer_start_switch_fiber(exiting ? nullptr : &f.fake_stack, sched.stack_bottom, sched.stack_size);
#else
  (void)exiting;
#endif
#if defined(GRADZIP_SIMT_TSAN)
  __tsan_switch_to_fiber(sched.tsan_thread, __tsan_switch_to_fiber_no_sync);
#endif
#if defined(__x86_64__)
  gradzip_simt_switch(&f.sp, sched.sp);
#else
  swapcontext(&f.uc, &sched.uc);
#endif
#if defined(GRADZIP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(f.fake_stack, nullptr, nullptr);
#endif
}

// ---------------------------------------------------------------------------------------------
// Launches and blocks
// ---------------------------------------------------------------------------------------------

std::string kernel_name(const void* kernel) {
  Dl_info info{};
  if (dladdr(kernel, &info) != 0 && info.dli_sname != nullptr) {
    int status = 0;
    char* demangled = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
    std::string name = status == 0 && demangled != nullptr ? demangled : info.dli_sname;
    std::free(demangled);
    return name;
  }
  std::ostringstream os;
  os << "kernel at " << kernel << " (link with -rdynamic for its name)";
  return os.str();
}

const char* describe(wait_kind k) {
  switch (k) {
    case wait_kind::none: return "nothing";
    case wait_kind::syncthreads: return "__syncthreads";
    case wait_kind::syncthreads_count: return "__syncthreads_count";
    case wait_kind::syncthreads_or: return "__syncthreads_or";
    case wait_kind::syncthreads_and: return "__syncthreads_and";
    case wait_kind::collective: return "a CUB block collective";
    case wait_kind::grid_sync: return "grid_sync";
    case wait_kind::syncwarp: return "__syncwarp";
    case wait_kind::shfl: return "__shfl_sync";
    case wait_kind::shfl_up: return "__shfl_up_sync";
    case wait_kind::shfl_down: return "__shfl_down_sync";
    case wait_kind::shfl_xor: return "__shfl_xor_sync";
    case wait_kind::ballot: return "__ballot_sync";
    case wait_kind::any: return "__any_sync";
    case wait_kind::all: return "__all_sync";
    case wait_kind::match_any: return "__match_any_sync";
    case wait_kind::activemask: return "__activemask";
  }
  return "?";
}

bool is_barrier(wait_kind k) {
  return k == wait_kind::syncthreads || k == wait_kind::syncthreads_count || k == wait_kind::syncthreads_or ||
         k == wait_kind::syncthreads_and;
}
bool is_warp_op(wait_kind k) { return k >= wait_kind::syncwarp; }

std::string hex(unsigned v);

/// Whether two waits are at one call site (__builtin_FILE's literals are usually one pointer).
bool same_site(const thread_context& a, const thread_context& b) {
  return a.line == b.line && (a.file == b.file || std::strcmp(a.file, b.file) == 0);
}

std::string where(const thread_context& c) {
  std::ostringstream os;
  os << describe(c.kind);
  if (c.kind == wait_kind::collective) os << " (" << c.collective.name << ")";
  if (is_warp_op(c.kind) && c.kind != wait_kind::activemask) os << " with mask " << hex(c.mask);
  if (c.file != nullptr) os << " at " << c.file << ":" << c.line;
  return os.str();
}

/// Reproducible shuffles: splitmix64 keyed by (seed, launch, block, round).
struct rng {
  std::uint64_t state;
  std::uint64_t next() {
    std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  template <class V>
  void shuffle(V& v) {
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[next() % i]);
  }
};

struct fault_exit {};  // unwinds nothing: a faulted launch abandons its fibers

/// One block of one launch, run to completion by the scheduler.
struct block_run {
  const launch_record* launch = nullptr;
  std::string name;
  uint3 block_idx{};
  unsigned threads = 0;
  fiber* fibers = nullptr;
  std::uint64_t barrier_generation = 0;
  std::unordered_map<const void*, std::uint64_t> storage_generation;  // CUB TempStorage reuse rule
  std::uint64_t rounds = 0;     // block-wide operations completed (barriers and collectives)
  char barrier_keys[2] = {};    // what orders their participants (TSan), by round
  std::vector<block_run>* grid = nullptr;  // a cooperative launch's blocks
  char turn_key = 0;            // a cooperative launch: what orders this block's turns (TSan)
  bool faulted = false;
  std::string fault_message;

  std::string header(const thread_context* c) const {
    std::ostringstream os;
    os << "kernel " << name << ", grid (" << launch->grid.x << "," << launch->grid.y << "," << launch->grid.z
       << ") x block (" << launch->block.x << "," << launch->block.y << "," << launch->block.z << "), block ("
       << block_idx.x << "," << block_idx.y << "," << block_idx.z << ")";
    if (c != nullptr) {
      os << ", thread (" << c->thread_idx.x << "," << c->thread_idx.y << "," << c->thread_idx.z << ") [warp "
         << c->warp << " lane " << c->lane << "]";
    }
    return os.str();
  }

  void raise(const thread_context* c, const std::string& message) {
    if (faulted) return;
    faulted = true;
    fault_message = header(c) + ":\n  " + message;
  }
};

std::vector<std::unique_ptr<fiber_stack>>& stack_pool() {
  static std::vector<std::unique_ptr<fiber_stack>> pool;
  return pool;
}

/// A cooperative launch's blocks take turns on one thread, and their static __shared__ variables
/// take turns at one address, whose accesses TSan cannot be told to forget. So in TSan's view a
/// block's turn follows the other blocks' earlier turns (begin_turn), and TSan sees no race
/// between blocks, as in an ordinary launch; a block's own threads stay ordered only by their
/// barriers.
void begin_turn(const block_run& b) {
  if (b.grid == nullptr) return;
  for (const block_run& other : *b.grid) {
    if (&other != &b) order_acquire(&other.turn_key);
  }
}
void end_turn(const block_run& b) {
  if (b.grid != nullptr) order_release(&b.turn_key);
}

void fiber_main() {
#if defined(GRADZIP_SIMT_ASAN)
  __sanitizer_finish_switch_fiber(nullptr, &sched.stack_bottom, &sched.stack_size);
#endif
  fiber& f = *sched.running;
  order_acquire(&block_start);
  begin_turn(*sched.block);
  try {
    sched.block->launch->body();
  } catch (const fault_exit&) {
  } catch (const std::exception& e) {
    sched.block->raise(&f.ctx, std::string("device code threw an exception: ") + e.what());
  } catch (...) {
    sched.block->raise(&f.ctx, "device code threw an exception");
  }
  end_turn(*sched.block);
  order_release(&block_end);
  f.state = fiber_state::exited;
  f.ctx.kind = wait_kind::none;
  f.stack->clean = true;
  yield_to_scheduler(f, true);
  std::abort();  // an exited fiber is never resumed
}

std::string hex(unsigned v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

/// The 64-bit value a lane posted to __match_any_sync.
std::uint64_t word_of(const thread_context& c) {
  std::uint64_t w;
  std::memcpy(&w, c.value, 8);
  return w;
}

/// Completes the warp operation of the group `members` (lanes of one warp, all waiting at it).
void complete_warp_op(block_run& b, fiber* warp_base, unsigned members) {
  const unsigned first = static_cast<unsigned>(__builtin_ctz(members));
  const thread_context& lead = warp_base[first].ctx;
  const wait_kind kind = lead.kind;
  for (unsigned m = members; m != 0; m &= m - 1) {
    const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
    thread_context& c = warp_base[lane].ctx;
    switch (kind) {
      case wait_kind::shfl:
      case wait_kind::shfl_up:
      case wait_kind::shfl_down:
      case wait_kind::shfl_xor: {
        const int width = c.width;
        if (width <= 0 || width > 32 || (width & (width - 1)) != 0) {
          b.raise(&c, std::string(describe(kind)) + ": width " + std::to_string(width) +
                          " is not a power of two in [1, 32]");
          return;
        }
        const unsigned segment = lane & ~static_cast<unsigned>(width - 1);
        unsigned src = lane;
        if (kind == wait_kind::shfl) {
          src = segment + (static_cast<unsigned>(c.operand) & static_cast<unsigned>(width - 1));
        } else if (kind == wait_kind::shfl_up) {
          const int s = static_cast<int>(lane) - c.operand;
          if (s >= static_cast<int>(segment)) src = static_cast<unsigned>(s);
        } else if (kind == wait_kind::shfl_down) {
          const unsigned s = lane + static_cast<unsigned>(c.operand);
          if (s < segment + static_cast<unsigned>(width)) src = s;
        } else {
          const unsigned s = lane ^ static_cast<unsigned>(c.operand);
          if (s < segment + static_cast<unsigned>(width) && s < 32) src = s;
        }
        if (((members >> src) & 1u) == 0) {
          b.raise(&c, std::string(describe(kind)) + " at " + c.file + ":" + std::to_string(c.line) + " reads lane " +
                          std::to_string(src) + ", which its mask " + hex(c.mask) + " does not name (undefined on a GPU)");
          return;
        }
        std::memcpy(c.result, warp_base[src].ctx.value, sizeof c.result);
        break;
      }
      case wait_kind::ballot:
      case wait_kind::any:
      case wait_kind::all: {
        unsigned votes = 0;
        for (unsigned o = members; o != 0; o &= o - 1) {
          const unsigned l = static_cast<unsigned>(__builtin_ctz(o));
          if (warp_base[l].ctx.operand != 0) votes |= 1u << l;
        }
        c.result_word = kind == wait_kind::ballot ? votes : kind == wait_kind::any ? (votes != 0) : (votes == members);
        break;
      }
      case wait_kind::match_any: {
        unsigned same = 0;
        for (unsigned o = members; o != 0; o &= o - 1) {
          const unsigned l = static_cast<unsigned>(__builtin_ctz(o));
          if (word_of(warp_base[l].ctx) == word_of(c)) same |= 1u << l;
        }
        c.result_word = same;
        break;
      }
      case wait_kind::activemask: c.result_word = members; break;
      default: break;  // syncwarp
    }
  }
  unsigned parity = 0;  // of each lane's arrival, for the keys its partners take (wait)
  for (unsigned m = members; m != 0; m &= m - 1) {
    const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
    parity |= ((warp_base[lane].ctx.lane_arrivals - 1) & 1u) << lane;
  }
  for (unsigned m = members; m != 0; m &= m - 1) {
    fiber& f = warp_base[__builtin_ctz(m)];
    f.state = fiber_state::runnable;
    f.ctx.kind = wait_kind::none;
    f.ctx.members = members;
    f.ctx.member_parity = parity;
  }
}

/// Completes every warp operation whose lanes have all arrived; faults on a mask that names an
/// exited or missing lane. Returns whether any completed.
bool resolve_warp_ops(block_run& b) {
  const bool strict = config().strict;
  bool progress = false;
  for (unsigned base = 0; base < b.threads && !b.faulted; base += 32) {
    fiber* warp = b.fibers + base;
    const unsigned lanes = std::min(32u, b.threads - base);
    unsigned done = 0;
    for (unsigned lane = 0; lane < lanes && !b.faulted; ++lane) {
      const thread_context& c = warp[lane].ctx;
      if (warp[lane].state != fiber_state::waiting || !is_warp_op(c.kind) || ((done >> lane) & 1u)) continue;
      unsigned members = 0;
      bool complete = true;
      if (c.kind == wait_kind::activemask) {  // the lanes converged here: waiting at this very call
        for (unsigned l = 0; l < lanes; ++l) {
          const thread_context& o = warp[l].ctx;
          if (warp[l].state == fiber_state::waiting && o.kind == wait_kind::activemask && same_site(o, c)) {
            members |= 1u << l;
          }
        }
      } else {
        members = c.mask;
        if (((members >> lane) & 1u) == 0) {
          b.raise(&c, where(c) + ": the mask does not name the calling lane " + std::to_string(lane));
          return progress;
        }
        for (unsigned m = members; m != 0; m &= m - 1) {
          const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
          if (l >= lanes) {
            b.raise(&c, where(c) + ": the mask names lane " + std::to_string(l) + ", which does not exist (a block of " +
                            std::to_string(b.threads) + " threads)");
            return progress;
          }
          const fiber& o = warp[l];
          if (o.state == fiber_state::exited) {
            b.raise(&c, where(c) + ": the mask names lane " + std::to_string(l) + ", which has exited");
            return progress;
          }
          if (o.state != fiber_state::waiting || o.ctx.kind != c.kind || o.ctx.mask != c.mask ||
              (strict && !same_site(o.ctx, c))) {
            complete = false;
            break;
          }
          if (o.ctx.value_size != c.value_size) {
            b.raise(&c, where(c) + ": lanes pass values of different sizes (" + std::to_string(c.value_size) + " and " +
                            std::to_string(o.ctx.value_size) + " bytes)");
            return progress;
          }
        }
      }
      if (!complete) continue;
      complete_warp_op(b, warp, members);
      done |= members;
      progress = true;
    }
  }
  return progress;
}

/// Releases a block-wide barrier or collective once every live thread waits at it.
bool resolve_block_wide(block_run& b) {
  const bool strict = config().strict;
  const thread_context* first = nullptr;
  unsigned exited = 0;
  for (unsigned t = 0; t < b.threads; ++t) {
    const fiber& f = b.fibers[t];
    if (f.state == fiber_state::exited) {
      ++exited;
      continue;
    }
    if (f.state != fiber_state::waiting) return false;
    const thread_context& c = f.ctx;
    if (!is_barrier(c.kind) && c.kind != wait_kind::collective) return false;
    if (first == nullptr) {
      first = &c;
      continue;
    }
    if (c.kind != first->kind || (c.kind == wait_kind::collective && c.collective.storage != first->collective.storage)) {
      b.raise(&c, "threads of one block wait at different block-wide operations: this one at " + where(c) +
                      ", thread " + std::to_string(first->rank) + " at " + where(*first));
      return false;
    }
    if ((strict || c.kind == wait_kind::collective) && !same_site(c, *first)) {
      b.raise(&c, "divergent " + std::string(describe(c.kind)) + ": this thread waits at " + where(c) + ", thread " +
                      std::to_string(first->rank) + " at " + where(*first));
      return false;
    }
  }
  if (first == nullptr) return false;
  if (exited != 0 && (strict || first->kind == wait_kind::collective)) {
    for (unsigned t = 0; t < b.threads; ++t) {
      if (b.fibers[t].state == fiber_state::exited) {
        b.raise(first, std::string(first->kind == wait_kind::collective ? "" : "divergent ") + where(*first) +
                           ": thread " + std::to_string(t) + " exited without reaching it");
        return false;
      }
    }
  }
  unsigned live = b.threads - exited;
  if (first->kind == wait_kind::collective) {
    std::vector<void*> in(b.threads), out(b.threads);
    for (unsigned t = 0; t < b.threads; ++t) {
      in[t] = const_cast<void*>(b.fibers[t].ctx.collective.input);
      out[t] = b.fibers[t].ctx.collective.output;
    }
    first->collective.run(in.data(), out.data(), b.threads, first->collective.extra);
    b.storage_generation[first->collective.storage] = b.barrier_generation;
  } else {
    unsigned count = 0;
    for (unsigned t = 0; t < b.threads; ++t) {
      if (b.fibers[t].state == fiber_state::waiting && b.fibers[t].ctx.operand != 0) ++count;
    }
    const unsigned result = first->kind == wait_kind::syncthreads_count ? count
                            : first->kind == wait_kind::syncthreads_or  ? (count != 0)
                            : first->kind == wait_kind::syncthreads_and ? (count == live)
                                                                        : 0u;
    for (unsigned t = 0; t < b.threads; ++t) b.fibers[t].ctx.result_word = result;
    ++b.barrier_generation;
  }
  for (unsigned t = 0; t < b.threads; ++t) {
    fiber& f = b.fibers[t];
    if (f.state == fiber_state::waiting) {
      f.state = fiber_state::runnable;
      f.ctx.kind = wait_kind::none;
    }
  }
  ++b.rounds;
  return true;
}

/// Nothing can move: names what the first stuck threads wait for.
void report_deadlock(block_run& b) {
  std::ostringstream os;
  os << "deadlock: no barrier or warp operation can complete";
  unsigned shown = 0;
  for (unsigned t = 0; t < b.threads && shown < 6; ++t) {
    const fiber& f = b.fibers[t];
    if (f.state != fiber_state::waiting) continue;
    os << "\n    thread " << t << " waits at " << where(f.ctx);
    if (is_warp_op(f.ctx.kind) && f.ctx.kind != wait_kind::activemask) {
      const unsigned base = t & ~31u;
      for (unsigned m = f.ctx.mask; m != 0; m &= m - 1) {
        const unsigned l = static_cast<unsigned>(__builtin_ctz(m));
        const fiber& o = b.fibers[base + l];
        if (o.ctx.kind != f.ctx.kind || o.ctx.mask != f.ctx.mask) {
          os << "; lane " << l << " of its mask waits at " << where(o.ctx) << " (the lanes never converge)";
          break;
        }
        if (config().strict && !same_site(o.ctx, f.ctx)) {
          os << "; lane " << l << " of its mask waits at " << where(o.ctx) << " (strict: another call site)";
          break;
        }
      }
    }
    ++shown;
  }
  b.raise(nullptr, os.str());
}

std::uint64_t launch_counter = 0;
std::uint64_t declined_cooperative = 0;  // under runtime_mutex

/// Prepares block b's fibers, on the stack pool's stacks [first_stack, first_stack + threads).
void start_block(block_run& b, std::size_t first_stack) {
  const launch_record& l = *b.launch;
  auto& pool = stack_pool();
  while (pool.size() < first_stack + b.threads) pool.push_back(std::make_unique<fiber_stack>(pool.size()));
  for (unsigned t = 0; t < b.threads; ++t) {
    fiber& f = b.fibers[t];
    f = fiber{};
    f.stack = pool[first_stack + t].get();
    thread_context& c = f.ctx;
    c.thread_idx = uint3{t % l.block.x, (t / l.block.x) % l.block.y, t / (l.block.x * l.block.y)};
    c.block_idx = b.block_idx;
    c.block_dim = l.block;
    c.grid_dim = l.grid;
    c.rank = t;
    c.lane = t % 32;
    c.warp = t / 32;
    prepare(f);
  }
}

/// Whether every live thread of b waits at a grid_sync (and one does).
bool parked_at_grid_sync(const block_run& b) {
  bool any = false;
  for (unsigned t = 0; t < b.threads; ++t) {
    const fiber& f = b.fibers[t];
    if (f.state == fiber_state::exited) continue;
    if (f.state != fiber_state::waiting || f.ctx.kind != wait_kind::grid_sync) return false;
    any = true;
  }
  return any;
}

/// How far advance_block took a block.
enum class block_outcome { exited, parked, stopped };  // parked: at a grid_sync; stopped: it raised a fault

/// Resumes b's threads until all have exited, every live one waits at a grid_sync, or it faults
/// (a deadlock included).
block_outcome advance_block(block_run& b, rng* order) {
  std::vector<unsigned> runnable;
  runnable.reserve(b.threads);
  sched.block = &b;
  for (;;) {
    runnable.clear();
    for (unsigned t = 0; t < b.threads; ++t) {
      if (b.fibers[t].state == fiber_state::runnable) runnable.push_back(t);
    }
    if (order != nullptr) order->shuffle(runnable);
    for (unsigned t : runnable) {
      resume(b.fibers[t]);
      if (b.faulted) return block_outcome::stopped;
    }
    bool all_exited = true;
    for (unsigned t = 0; t < b.threads && all_exited; ++t) all_exited = b.fibers[t].state == fiber_state::exited;
    if (all_exited) return block_outcome::exited;
    if (resolve_warp_ops(b)) continue;
    if (b.faulted) return block_outcome::stopped;
    if (resolve_block_wide(b)) continue;
    if (b.faulted) return block_outcome::stopped;
    if (parked_at_grid_sync(b)) return block_outcome::parked;
    report_deadlock(b);
    return block_outcome::stopped;
  }
}

/// Every block of a cooperative launch waits at a grid_sync (or has exited): releases it, or
/// raises the fault that keeps it from releasing. Every thread of the grid must arrive, as CUDA's
/// grid barrier needs (an exited thread would hang it); strict: at one call site.
bool release_grid_sync(std::vector<block_run>& blocks) {
  const thread_context* first = nullptr;
  for (auto& b : blocks) {
    for (unsigned t = 0; t < b.threads && first == nullptr; ++t) {
      if (b.fibers[t].state == fiber_state::waiting) first = &b.fibers[t].ctx;
    }
  }
  for (auto& b : blocks) {
    for (unsigned t = 0; t < b.threads; ++t) {
      const fiber& f = b.fibers[t];
      if (f.state == fiber_state::exited) {
        b.raise(&f.ctx, "exited while other threads of the grid wait at " + where(*first) +
                            ": a grid-wide barrier waits for every thread of the grid");
        return false;
      }
      if (config().strict && !same_site(f.ctx, *first)) {
        b.raise(&f.ctx, "divergent grid_sync: this thread waits at " + where(f.ctx) + ", another at " + where(*first));
        return false;
      }
    }
  }
  for (auto& b : blocks) {
    for (unsigned t = 0; t < b.threads; ++t) {
      b.fibers[t].state = fiber_state::runnable;
      b.fibers[t].ctx.kind = wait_kind::none;
    }
    ++b.barrier_generation;  // a grid barrier is a block barrier too (CUB's TempStorage reuse rule)
  }
  ++grid_rounds;
  return true;
}

/// A faulted block's threads that wait at a synchronization point are abandoned, never to
/// release their end (TSan): the scheduler takes what each released on arriving there instead,
/// so that the host's later work (freeing what they read) follows them.
void order_after_abandoned(const block_run& b) {
  for (unsigned t = 0; t < b.threads; ++t) {
    const thread_context& c = b.fibers[t].ctx;
    for (int k = 0; k < 2; ++k) {
      order_acquire(&c.lane_keys[k]);
      order_acquire(&c.whole_warp_keys[k]);
    }
  }
  for (int k = 0; k < 2; ++k) {
    order_acquire(&b.barrier_keys[k]);
    order_acquire(&grid_keys[k]);
  }
  order_acquire(&b.turn_key);
}

/// Runs one block: every thread a fiber, resumed until all have exited.
void run_block(block_run& b, rng* order) {
  start_block(b, 0);
  advance_block(b, order);  // grid_sync faults outside a cooperative launch, so it never parks
}

// ---------------------------------------------------------------------------------------------
// Runtime state: errors, memory, streams
// ---------------------------------------------------------------------------------------------

std::recursive_mutex& runtime_mutex() {
  static std::recursive_mutex m;
  return m;
}

cudaError_t last_error = cudaSuccess;
cudaError_t pending_fault = cudaSuccess;  // a faulted launch under expect_faults, for the next sync
std::string fault_text;

cudaError_t set_error(cudaError_t e) {
  if (e != cudaSuccess) last_error = e;
  return e;
}

cudaError_t complain(cudaError_t e, const std::string& what) {
  std::fprintf(stderr, "gradzip SIMT: %s\n", what.c_str());
  return set_error(e);
}

/// Hands a synchronizing call the fault of a launch it ran (expect_faults), once.
cudaError_t take_pending() {
  const cudaError_t e = pending_fault;
  pending_fault = cudaSuccess;
  return set_error(e);
}

struct allocation {
  std::size_t size;
  bool pinned;  // host memory from cudaMallocHost
};
std::map<std::uintptr_t, allocation>& allocations() {
  static std::map<std::uintptr_t, allocation> a;
  return a;
}

/// The allocation holding [p, p + bytes), if one does.
const allocation* find_allocation(const void* p, std::size_t bytes, bool pinned) {
  auto& a = allocations();
  const auto address = reinterpret_cast<std::uintptr_t>(p);
  auto it = a.upper_bound(address);
  if (it == a.begin()) return nullptr;
  --it;
  if (it->second.pinned != pinned || address + bytes > it->first + it->second.size || address < it->first) return nullptr;
  return &it->second;
}
bool is_device(const void* p, std::size_t bytes) { return find_allocation(p, bytes == 0 ? 1 : bytes, false) != nullptr; }

/// Under ASan, makes [begin, begin + bytes) unaddressable: what an allocation holds past its
/// size (cudaMalloc rounds up to 256 bytes, dynamic shared memory to its allocation unit). A GPU
/// does not fault there, but a kernel that reads or writes past its buffer is wrong wherever the
/// buffer is carved from a larger one (a framework's caching allocator, a tensor's storage).
void poison_slack(void* begin, std::size_t bytes) {
#if defined(GRADZIP_SIMT_ASAN)
  ASAN_POISON_MEMORY_REGION(begin, bytes);
#else
  (void)begin;
  (void)bytes;
#endif
}

void* allocate(std::size_t bytes, bool pinned) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 1) + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (p == nullptr) return nullptr;
  std::memset(p, poison_byte, rounded);
  poison_slack(static_cast<unsigned char*>(p) + bytes, rounded - bytes);
  allocations()[reinterpret_cast<std::uintptr_t>(p)] = allocation{bytes, pinned};
  return p;
}

bool release(void* p, bool pinned) {
  auto& a = allocations();
  auto it = a.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == a.end() || it->second.pinned != pinned) return false;
  a.erase(it);
  std::free(p);
  return true;
}

}  // namespace
}  // namespace gradzip_simt

// The runtime's opaque stream and event types, completed here.
struct CUstream_st {
  struct op {
    std::uint64_t seq;
    std::vector<std::pair<CUstream_st*, std::uint64_t>> after;  // (stream, seq) that must run first
    std::function<void()> work;
  };
  unsigned flags = 0;
  bool legacy = false;
  bool destroyed = false;
  std::deque<op> queue;
  std::uint64_t enqueued = 0;
  std::uint64_t executed = 0;
};

struct CUevent_st {
  CUstream_st* stream = nullptr;
  std::uint64_t seq = 0;
  bool recorded = false;
  bool completed = false;
  std::chrono::steady_clock::time_point when{};
};

namespace gradzip_simt {
namespace {

CUstream_st& legacy_stream() {
  static CUstream_st s = [] {
    CUstream_st l;
    l.legacy = true;
    return l;
  }();
  return s;
}

std::vector<std::unique_ptr<CUstream_st>>& streams() {
  static std::vector<std::unique_ptr<CUstream_st>> all;
  return all;
}

CUstream_st* per_thread_stream() {
  static CUstream_st* s = [] {
    streams().push_back(std::make_unique<CUstream_st>());
    return streams().back().get();
  }();
  return s;
}

/// The stream a handle names; null for one that is not a live stream.
CUstream_st* stream_of(cudaStream_t handle) {
  if (handle == nullptr || handle == cudaStreamLegacy) return &legacy_stream();
  if (handle == cudaStreamPerThread) return per_thread_stream();
  for (auto& s : streams()) {
    if (s.get() == handle && !s->destroyed) return s.get();
  }
  return nullptr;
}

bool blocking(const CUstream_st& s) { return !s.legacy && (s.flags & cudaStreamNonBlocking) == 0; }

/// Adds `work` to s's queue, after the legacy stream's implicit dependencies: work on the legacy
/// stream waits for every blocking stream's earlier work, and blocking streams wait for the
/// legacy stream's.
std::uint64_t enqueue(CUstream_st& s, std::function<void()> work) {
  CUstream_st::op o{++s.enqueued, {}, std::move(work)};
  CUstream_st& legacy = legacy_stream();
  if (s.legacy) {
    for (auto& t : streams()) {
      if (blocking(*t) && t->enqueued > t->executed) o.after.emplace_back(t.get(), t->enqueued);
    }
  } else if (blocking(s) && legacy.enqueued > legacy.executed) {
    o.after.emplace_back(&legacy, legacy.enqueued);
  }
  s.queue.push_back(std::move(o));
  return s.enqueued;
}

/// Runs s's queued work up to and including `seq` (and whatever that work waits for).
void flush(CUstream_st& s, std::uint64_t seq) {
  while (s.executed < seq && !s.queue.empty()) {
    CUstream_st::op o = std::move(s.queue.front());
    s.queue.pop_front();
    for (auto& [t, upto] : o.after) flush(*t, upto);
    o.work();
    s.executed = o.seq;
  }
}

void flush_all() {
  flush(legacy_stream(), legacy_stream().enqueued);
  for (auto& s : streams()) flush(*s, s->enqueued);
}

// ---------------------------------------------------------------------------------------------
// Running a launch
// ---------------------------------------------------------------------------------------------

std::unordered_map<const void*, int>& max_dynamic_shared() {
  static std::unordered_map<const void*, int> m;
  return m;
}

constexpr std::size_t default_shared_limit = 48 * 1024;
constexpr std::size_t optin_shared_limit = 227 * 1024;  // sm_90's

void report_fault(const std::string& message) {
  if (config().expect_faults) {
    fault_text = message;
    pending_fault = cudaErrorLaunchFailure;
    last_error = cudaErrorLaunchFailure;
    return;
  }
  std::fprintf(stderr, "\ngradzip SIMT fault in %s\n", message.c_str());
  std::fflush(stderr);
  std::abort();
}

unsigned char* block_dynamic_shared = nullptr;  // the running block's dynamic shared memory

/// A block's dynamic shared memory of `bytes` inside `storage` (bytes + 256 long): 256-byte
/// aligned, what follows it unaddressable under ASan.
unsigned char* block_shared_memory(std::vector<unsigned char>& storage, std::size_t bytes) {
  auto* base = reinterpret_cast<unsigned char*>((reinterpret_cast<std::uintptr_t>(storage.data()) + 255) / 256 * 256);
  poison_slack(base + bytes, static_cast<std::size_t>(storage.data() + storage.size() - base) - bytes);
  return base;
}

// ---------------------------------------------------------------------------------------------
// Static __shared__ variables
// ---------------------------------------------------------------------------------------------

/// Where static __shared__ variables live: one section, where the compiler honours a section on a
/// function's local static (clang does; GCC ignores it on a template's, and every gradzip kernel
/// is a template), so the backend can give each block its own poisoned copy. The section's name
/// starts with a dot, so that ASan still puts its redzones between the variables (it leaves
/// sections named like C identifiers alone, for their __start_/__stop_ arrays); the section is
/// found in the executable's section headers instead.
using byte_span = std::pair<unsigned char*, std::size_t>;

/// The section's address and size in this process; {nullptr, 0} when it has none.
byte_span find_static_shared_section() {
  std::ifstream exe("/proc/self/exe", std::ios::binary);
  Elf64_Ehdr header{};
  if (!exe.read(reinterpret_cast<char*>(&header), sizeof header) || std::memcmp(header.e_ident, ELFMAG, SELFMAG) != 0 ||
      header.e_ident[EI_CLASS] != ELFCLASS64 || header.e_shentsize != sizeof(Elf64_Shdr) || header.e_shnum == 0) {
    return {nullptr, 0};
  }
  std::vector<Elf64_Shdr> sections(header.e_shnum);
  exe.seekg(static_cast<std::streamoff>(header.e_shoff));
  exe.read(reinterpret_cast<char*>(sections.data()), static_cast<std::streamsize>(sections.size() * sizeof(Elf64_Shdr)));
  if (!exe || header.e_shstrndx >= sections.size()) return {nullptr, 0};
  const Elf64_Shdr& names = sections[header.e_shstrndx];
  std::string table(names.sh_size, '\0');
  exe.seekg(static_cast<std::streamoff>(names.sh_offset));
  exe.read(table.data(), static_cast<std::streamsize>(table.size()));
  if (!exe) return {nullptr, 0};
  for (const Elf64_Shdr& s : sections) {
    if (s.sh_name >= table.size() || std::strcmp(table.c_str() + s.sh_name, static_shared_section) != 0) continue;
    // The executable's load bias: the first object dl_iterate_phdr reports is the program.
    std::uintptr_t bias = 0;
    dl_iterate_phdr(
        [](dl_phdr_info* info, std::size_t, void* out) {
          *static_cast<std::uintptr_t*>(out) = info->dlpi_addr;
          return 1;
        },
        &bias);
    return {reinterpret_cast<unsigned char*>(bias + s.sh_addr), s.sh_size};
  }
  return {nullptr, 0};
}

/// The section's bytes that belong to variables: all of it, or under ASan the spans between the
/// redzones it poisoned.
const std::vector<byte_span>& static_shared_spans() {
  static const std::vector<byte_span> spans = [] {
    std::vector<byte_span> out;
    const auto [base, size] = find_static_shared_section();
    if (base == nullptr || size == 0) return out;
#if defined(GRADZIP_SIMT_ASAN)
    unsigned char* const end = base + size;
    for (unsigned char* p = base; p < end;) {
      while (p < end && __asan_address_is_poisoned(p)) ++p;
      unsigned char* q = p;
      while (q < end && !__asan_address_is_poisoned(q)) ++q;
      if (q > p) out.emplace_back(p, static_cast<std::size_t>(q - p));
      p = q;
    }
#else
    out.emplace_back(base, size);
#endif
    return out;
  }();
  return spans;
}

std::size_t static_shared_bytes() {
  std::size_t total = 0;
  for (const auto& s : static_shared_spans()) total += s.second;
  return total;
}

/// Every block starts with its static __shared__ variables poisoned, as dynamic shared memory.
void poison_static_shared() {
  for (const auto& [p, n] : static_shared_spans()) std::memset(p, poison_byte, n);
}

/// A block's own copy of the static __shared__ variables, while another block of a cooperative
/// launch runs: saved when the block parks, restored when it resumes.
void save_static_shared(std::vector<unsigned char>& image) {
  image.resize(static_shared_bytes());
  std::size_t at = 0;
  for (const auto& [p, n] : static_shared_spans()) {
    std::memcpy(image.data() + at, p, n);
    at += n;
  }
}

void restore_static_shared(const std::vector<unsigned char>& image) {
  std::size_t at = 0;
  for (const auto& [p, n] : static_shared_spans()) {
    std::memcpy(p, image.data() + at, n);
    at += n;
  }
}

/// A cooperative launch: every block's fibers at once. In each round every block that has not
/// exited runs until it parks at the grid_sync (blocks in a shuffled order under a seed), then the
/// barrier releases them all. Each block has its own dynamic shared memory, and its own static
/// __shared__ variables where they live in their section (static_shared_spans: a clang build).
void run_cooperative(const launch_record& l, std::uint64_t launch_id) {
  const unsigned threads = l.block.x * l.block.y * l.block.z;
  const std::uint64_t count = static_cast<std::uint64_t>(l.grid.x) * l.grid.y * l.grid.z;
  std::vector<fiber> fibers(count * threads);
  std::vector<block_run> blocks(count);
  std::vector<std::vector<unsigned char>> dynamic(count);
  std::vector<unsigned char*> shared_bases(count);  // each block's dynamic shared memory, in dynamic[i]
  std::vector<std::vector<unsigned char>> statics(count);  // each block's static __shared__ variables
  std::vector<rng> thread_rngs;
  const std::uint64_t seed = config().shuffle_seed;
  for (std::uint64_t i = 0; i < count; ++i) {
    block_run& b = blocks[i];
    b.launch = &l;
    b.grid = &blocks;
    b.name = kernel_name(l.kernel);
    b.threads = threads;
    b.fibers = fibers.data() + i * threads;
    b.block_idx = uint3{static_cast<unsigned>(i % l.grid.x), static_cast<unsigned>((i / l.grid.x) % l.grid.y),
                        static_cast<unsigned>(i / (static_cast<std::uint64_t>(l.grid.x) * l.grid.y))};
    dynamic[i].assign(l.shared_bytes + 256, poison_byte);
    shared_bases[i] = block_shared_memory(dynamic[i], l.shared_bytes);
    statics[i].assign(static_shared_bytes(), poison_byte);
    thread_rngs.push_back(rng{(seed + 0x632BE59BD9B4E019ull) * (launch_id + 1) ^ (i * 0xD1B54A32D192ED03ull)});
    start_block(b, i * threads);
  }
  std::vector<bool> exited(count, false);
  rng block_rng{seed * 0x9E3779B97F4A7C15ull ^ launch_id};
  for (;;) {
    std::vector<std::uint64_t> order;
    for (std::uint64_t i = 0; i < count; ++i) {
      if (!exited[i]) order.push_back(i);
    }
    if (order.empty()) return;
    if (seed != 0) block_rng.shuffle(order);
    for (std::uint64_t i : order) {
      block_dynamic_shared = shared_bases[i];
      restore_static_shared(statics[i]);
      const block_outcome o = advance_block(blocks[i], seed != 0 ? &thread_rngs[i] : nullptr);
      save_static_shared(statics[i]);
      block_dynamic_shared = nullptr;
      if (o == block_outcome::stopped) {
        for (const block_run& abandoned : blocks) order_after_abandoned(abandoned);
        report_fault(blocks[i].fault_message);
        return;
      }
      exited[i] = o == block_outcome::exited;
    }
    if (std::find(exited.begin(), exited.end(), false) == exited.end()) return;
    if (!release_grid_sync(blocks)) {
      for (const auto& b : blocks) {
        if (b.faulted) {
          for (const block_run& abandoned : blocks) order_after_abandoned(abandoned);
          report_fault(b.fault_message);
          return;
        }
      }
    }
  }
}

/// What the backend keeps per kernel, from every launch it accepted: launches_of reads it, and at
/// exit --simt-list-kernels prints it and --simt-record-launches writes it. Under runtime_mutex.
struct launch_extent {
  std::uint64_t launches = 0;
  std::uint64_t threads = 0;        // the most threads per block of any launch
  std::size_t dynamic_shared = 0;   // the most bytes of dynamic shared memory
  long long max_dynamic_shared = -1;  // cudaFuncAttributeMaxDynamicSharedMemorySize at the launches (-1: unset)
};

void list_launched_kernels(const std::map<const void*, launch_extent>& extents) {
  std::map<std::string, std::uint64_t> by_name;
  for (const auto& [kernel, e] : extents) by_name[kernel_name(kernel)] += e.launches;
  for (const auto& [name, count] : by_name) std::printf("simt kernel %8llu  %s\n", static_cast<unsigned long long>(count), name.c_str());
}

void record_launches(const std::map<const void*, launch_extent>& extents, const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "gradzip SIMT: cannot write %s (%s)\n", path.c_str(), std::strerror(errno));
    std::_Exit(1);
  }
  for (const auto& [kernel, e] : extents) {
    Dl_info info{};
    if (dladdr(kernel, &info) == 0 || info.dli_sname == nullptr) continue;  // unnamed: not in a PTX either
    std::fprintf(f, "%s %llu %zu %lld\n", info.dli_sname, static_cast<unsigned long long>(e.threads), e.dynamic_shared,
                 e.max_dynamic_shared);
  }
  std::fclose(f);
}

std::map<const void*, launch_extent>& launch_extents() {
  static std::map<const void*, launch_extent> extents;
  static const bool registered = [] {
    runtime_mutex();  // constructed first, so destroyed after the handler runs
    std::atexit([] {
      std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
      if (config().list_kernels) list_launched_kernels(launch_extents());
      if (!config().record_launches.empty()) record_launches(launch_extents(), config().record_launches);
    });
    return true;
  }();
  (void)registered;
  return extents;
}

void run_grid(const launch_record& l) {
  const scheduler_scope scope;
  const std::uint64_t launch_id = ++launch_counter;
  if (l.host_pointer >= 0) {
    // A GPU faults (cudaErrorIllegalAddress) when the kernel dereferences it; here every such
    // parameter is one, whether or not the kernel reads it (gradzip passes null for unused ones).
    report_fault(kernel_name(l.kernel) + ": parameter " + std::to_string(l.host_pointer) +
                 " points to host memory a GPU cannot reach (not from cudaMalloc or cudaMallocHost)");
    return;
  }
  if (l.cooperative) {
    run_cooperative(l, launch_id);
    return;
  }
  const unsigned threads = l.block.x * l.block.y * l.block.z;
  const std::uint64_t blocks = static_cast<std::uint64_t>(l.grid.x) * l.grid.y * l.grid.z;
  std::vector<fiber> fibers(threads);
  std::vector<unsigned char> dynamic(l.shared_bytes + 256);
  unsigned char* const shared_base = block_shared_memory(dynamic, l.shared_bytes);
  const std::uint64_t seed = config().shuffle_seed;
  std::vector<std::uint64_t> order(blocks);
  for (std::uint64_t i = 0; i < blocks; ++i) order[i] = i;
  rng block_rng{seed * 0x9E3779B97F4A7C15ull ^ launch_id};
  if (seed != 0) block_rng.shuffle(order);
  block_run b;
  b.launch = &l;
  b.name = kernel_name(l.kernel);
  b.threads = threads;
  b.fibers = fibers.data();
  for (std::uint64_t i : order) {
    b.block_idx = uint3{static_cast<unsigned>(i % l.grid.x), static_cast<unsigned>((i / l.grid.x) % l.grid.y),
                        static_cast<unsigned>(i / (static_cast<std::uint64_t>(l.grid.x) * l.grid.y))};
    b.barrier_generation = 0;
    b.storage_generation.clear();
    std::memset(shared_base, poison_byte, l.shared_bytes);
    poison_static_shared();
    block_dynamic_shared = shared_base;
    rng thread_rng{(seed + 0x632BE59BD9B4E019ull) * (launch_id + 1) ^ (i * 0xD1B54A32D192ED03ull)};
    run_block(b, seed != 0 ? &thread_rng : nullptr);
    order_blocks();
    block_dynamic_shared = nullptr;
    if (b.faulted) {
      order_after_abandoned(b);
      report_fault(b.fault_message);
      return;
    }
  }
}


}  // namespace

bool static_shared_per_block() { return !static_shared_spans().empty(); }

bool device_accessible(const void* p) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  const auto* byte = static_cast<const unsigned char*>(p);
  for (const bool pinned : {false, true}) {
    if (find_allocation(byte, 1, pinned) != nullptr || find_allocation(byte - 1, 1, pinned) != nullptr) return true;
  }
  return false;
}

void* dynamic_shared() {
  context();  // inside a kernel only
  return block_dynamic_shared;
}

void fault(const std::string& message) {
  fiber* f = sched.running;
  if (f == nullptr || sched.block == nullptr) {
    std::fprintf(stderr, "\ngradzip SIMT fault: %s\n", message.c_str());
    std::abort();
  }
  sched.block->raise(&f->ctx, message);
  throw fault_exit{};  // unwinds the fiber's frames to fiber_main, which exits it
}

void wait(wait_kind kind, unsigned mask, const char* file, int line) {
  fiber* f = sched.running;
  if (f == nullptr) fault(std::string(describe(kind)) + " called outside a kernel");
  f->ctx.kind = kind;
  f->ctx.mask = mask;
  f->ctx.file = file;
  f->ctx.line = line;
  f->state = fiber_state::waiting;
  // What orders this thread with the others here (TSan). Every arrival releases into a key,
  // and the thread takes, on leaving, the keys of the operation's participants: the block's
  // (or the grid's) for a barrier; the warp's when a warp operation's mask names all 32 lanes
  // (it completes only once all have arrived); else each joined lane's own. Keys alternate
  // by round, so a participant that has left and arrives at its next operation adds to the
  // other key: every participant leaves before the next operation can complete.
  thread_context& c = f->ctx;
  fiber* const warp_base = sched.block->fibers + (c.rank & ~31u);
  const bool warp_op = is_warp_op(kind), whole_warp = warp_op && kind != wait_kind::activemask && mask == ~0u;
  const void* key = whole_warp ? &warp_base->ctx.whole_warp_keys[c.whole_warp_arrivals++ & 1]
                    : warp_op  ? &c.lane_keys[c.lane_arrivals++ & 1]
                    : kind == wait_kind::grid_sync ? static_cast<const void*>(&grid_keys[grid_rounds & 1])
                                                   : &sched.block->barrier_keys[sched.block->rounds & 1];
  order_release(key);
  if (kind == wait_kind::grid_sync) end_turn(*sched.block);
  yield_to_scheduler(*f, false);
  if (kind == wait_kind::grid_sync) begin_turn(*sched.block);
  if (!warp_op || whole_warp) {
    order_acquire(key);
    return;
  }
  for (unsigned m = c.members; m != 0; m &= m - 1) {
    const unsigned lane = static_cast<unsigned>(__builtin_ctz(m));
    order_acquire(&warp_base[lane].ctx.lane_keys[(c.member_parity >> lane) & 1]);
  }
}

void grid_sync(const char* file, int line) {
  context();
  if (!sched.block->launch->cooperative) {
    fault(std::string("grid_sync at ") + file + ":" + std::to_string(line) +
          " in an ordinary launch: only a cooperative launch keeps every block resident, so that a grid-wide "
          "barrier can complete");
  }
  wait(wait_kind::grid_sync, 0, file, line);
}

void block_collective(const collective_call& call, const char* file, int line) {
  thread_context& c = context();
  block_run& b = *sched.block;
  const unsigned threads = c.block_dim.x * c.block_dim.y * c.block_dim.z;
  if (threads != call.block_threads) {
    fault(std::string(call.name) + " is instantiated for " + std::to_string(call.block_threads) +
          " threads, but the block has " + std::to_string(threads));
  }
  auto it = b.storage_generation.find(call.storage);
  if (it != b.storage_generation.end() && it->second == b.barrier_generation) {
    fault(std::string(call.name) + " at " + file + ":" + std::to_string(line) +
          " reuses its TempStorage without a __syncthreads() since the storage's last use (CUB requires one)");
  }
  c.collective = call;
  wait(wait_kind::collective, 0, file, line);
}

cudaError_t enqueue_launch(cudaStream_t stream, launch_record&& record) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  const launch_record& r = record;
  const std::uint64_t threads = static_cast<std::uint64_t>(r.block.x) * r.block.y * r.block.z;
  std::string problem;
  if (r.grid.x == 0 || r.grid.y == 0 || r.grid.z == 0) problem = "a grid with no blocks";
  else if (r.block.x == 0 || r.block.y == 0 || r.block.z == 0) problem = "a block with no threads";
  else if (threads > 1024) problem = "more than 1024 threads per block";
  else if (r.grid.x > config().max_grid_x || r.grid.y > 65535 || r.grid.z > 65535) problem = "a grid larger than the device's";
  else if (r.block.z > 64) problem = "blockDim.z above 64";
  const std::uint64_t resident = config().max_cooperative_blocks != 0
                                     ? config().max_cooperative_blocks
                                     : static_cast<std::uint64_t>(config().sm_count) * config().blocks_per_sm;
  if (problem.empty() && r.cooperative && !config().cooperative_launch) {
    ++declined_cooperative;
    return complain(cudaErrorNotSupported, "cooperative launch of " + kernel_name(r.kernel) +
                                               ": the device has no cooperative launches (cudaDevAttrCooperativeLaunch "
                                               "0; cudaErrorNotSupported)");
  }
  if (problem.empty() && r.cooperative && static_cast<std::uint64_t>(r.grid.x) * r.grid.y * r.grid.z > resident) {
    std::ostringstream os;
    ++declined_cooperative;
    os << "cooperative launch of " << kernel_name(r.kernel) << " with " << r.grid.x * r.grid.y * r.grid.z
       << " blocks: more than the device holds at once (" << resident << "; cudaErrorCooperativeLaunchTooLarge)";
    return complain(cudaErrorCooperativeLaunchTooLarge, os.str());
  }
  if (!problem.empty()) {
    std::ostringstream os;
    os << "launch of " << kernel_name(r.kernel) << " with grid (" << r.grid.x << "," << r.grid.y << "," << r.grid.z
       << ") x block (" << r.block.x << "," << r.block.y << "," << r.block.z << "): " << problem
       << " (cudaErrorInvalidConfiguration)";
    return complain(cudaErrorInvalidConfiguration, os.str());
  }
  std::size_t limit = default_shared_limit;
  auto opt = max_dynamic_shared().find(r.kernel);
  if (opt != max_dynamic_shared().end()) limit = static_cast<std::size_t>(opt->second);
  if (r.shared_bytes > limit) {
    return complain(cudaErrorInvalidValue, "launch of " + kernel_name(r.kernel) + " asks for " +
                                               std::to_string(r.shared_bytes) + " bytes of dynamic shared memory, " +
                                               "above the limit of " + std::to_string(limit) +
                                               " (raise it with cudaFuncSetAttribute)");
  }
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return complain(cudaErrorInvalidResourceHandle, "launch on a stream that does not exist");
  {
    launch_extent& e = launch_extents()[r.kernel];
    ++e.launches;
    e.threads = std::max(e.threads, threads);
    e.dynamic_shared = std::max(e.dynamic_shared, r.shared_bytes);
    if (opt != max_dynamic_shared().end()) e.max_dynamic_shared = std::max<long long>(e.max_dynamic_shared, opt->second);
  }
  auto shared = std::make_shared<launch_record>(std::move(record));
  enqueue(*s, [shared] { run_grid(*shared); });
  return cudaSuccess;
}

cudaError_t enqueue_work(cudaStream_t stream, std::function<void()> work) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return complain(cudaErrorInvalidResourceHandle, "work enqueued on a stream that does not exist");
  enqueue(*s, std::move(work));
  return cudaSuccess;
}

cudaError_t report(cudaError_t e, const std::string& message) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  return complain(e, message);
}

bool device_range(const void* p, std::size_t bytes) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  return is_device(p, bytes);
}

std::string take_fault() {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  std::string m = std::move(fault_text);
  fault_text.clear();
  return m;
}

std::uint64_t declined_cooperative_launches() {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  return declined_cooperative;
}

std::uint64_t host_wait_count = 0;  // under runtime_mutex

std::uint64_t host_waits() {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  return host_wait_count;
}

std::uint64_t launches_of(const std::string& part) {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  std::uint64_t total = 0;
  for (const auto& [kernel, e] : launch_extents()) {
    if (kernel_name(kernel).find(part) != std::string::npos) total += e.launches;
  }
  return total;
}

std::size_t live_device_bytes() {
  std::lock_guard<std::recursive_mutex> lock(runtime_mutex());
  std::size_t total = 0;
  for (const auto& [p, a] : allocations()) {
    if (!a.pinned) total += a.size;
  }
  return total;
}

int parse_options(int argc, char** argv) {
  int kept = 1;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* prefix) { return std::strtoull(a.c_str() + std::strlen(prefix), nullptr, 10); };
    if (a.rfind("--simt-shuffle=", 0) == 0) {
      config().shuffle_seed = value("--simt-shuffle=");
    } else if (a == "--simt-strict") {
      config().strict = true;
    } else if (a.rfind("--simt-sm-count=", 0) == 0) {
      config().sm_count = static_cast<int>(value("--simt-sm-count="));
    } else if (a == "--simt-list-kernels") {
      config().list_kernels = true;
      launch_extents();
    } else if (a.rfind("--simt-max-grid=", 0) == 0) {
      config().max_grid_x = static_cast<unsigned>(value("--simt-max-grid="));
    } else if (a.rfind("--simt-blocks-per-sm=", 0) == 0) {
      config().blocks_per_sm = static_cast<int>(value("--simt-blocks-per-sm="));
    } else if (a.rfind("--simt-max-cooperative=", 0) == 0) {
      config().max_cooperative_blocks = static_cast<unsigned>(value("--simt-max-cooperative="));
    } else if (a.rfind("--simt-record-launches=", 0) == 0) {
      config().record_launches = a.substr(std::strlen("--simt-record-launches="));
      launch_extents();
    } else if (a == "--simt-no-cooperative") {
      config().cooperative_launch = false;
    } else {
      argv[kept++] = argv[i];
    }
  }
  return kept;
}

}  // namespace gradzip_simt

// =============================================================================================
// The CUDA runtime API, as far as gradzip and its tests call it
// =============================================================================================

using namespace gradzip_simt;
using lock_t = std::lock_guard<std::recursive_mutex>;

namespace {

std::string bad_range(const char* call, const char* what, const void* p, std::size_t bytes) {
  std::ostringstream os;
  os << call << ": the " << what << " [" << p << ", +" << bytes << ") is not inside one live device allocation";
  return os.str();
}

/// Checks a copy's pointers against its kind; cudaMemcpyDefault infers the kind.
cudaError_t check_copy(const char* call, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind& kind) {
  if (bytes == 0) return cudaSuccess;
  if (kind == cudaMemcpyDefault) {
    const bool d = is_device(dst, bytes), s = is_device(src, bytes);
    kind = d ? (s ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice)
             : (s ? cudaMemcpyDeviceToHost : cudaMemcpyHostToHost);
  }
  const bool dst_device = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  const bool src_device = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (dst_device && !is_device(dst, bytes)) return complain(cudaErrorInvalidValue, bad_range(call, "destination", dst, bytes));
  if (src_device && !is_device(src, bytes)) return complain(cudaErrorInvalidValue, bad_range(call, "source", src, bytes));
  if (!dst_device && is_device(dst, 1)) {
    return complain(cudaErrorInvalidValue, std::string(call) + ": the destination is device memory, but the kind says host");
  }
  if (!src_device && is_device(src, 1)) {
    return complain(cudaErrorInvalidValue, std::string(call) + ": the source is device memory, but the kind says host");
  }
  return cudaSuccess;
}

/// Enqueues a copy. From pageable host memory the source is read now (CUDA stages it before
/// returning); everything else is read when the copy runs.
void enqueue_copy(CUstream_st& s, void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  if (bytes == 0) {
    enqueue(s, [] {});
    return;
  }
  if (kind == cudaMemcpyHostToDevice && find_allocation(src, bytes, true) == nullptr) {
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + bytes);
    enqueue(s, [dst, staged] { std::memcpy(dst, staged->data(), staged->size()); });
  } else {
    enqueue(s, [dst, src, bytes] { std::memmove(dst, src, bytes); });
  }
}

}  // namespace

extern "C" {

cudaError_t cudaGetLastError() {
  lock_t lock(runtime_mutex());
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError() {
  lock_t lock(runtime_mutex());
  return last_error;
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchFailure: return "cudaErrorLaunchFailure";
    case cudaErrorNotSupported: return "cudaErrorNotSupported";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevice: return "invalid device ordinal";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchFailure: return "unspecified launch failure (a SIMT fault: see take_fault)";
    case cudaErrorNotSupported: return "operation not supported";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    default: return "unknown error";
  }
}

// ---- device ----

cudaError_t cudaGetDeviceCount(int* count) {
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  return device == 0 ? cudaSuccess : set_error(cudaErrorInvalidDevice);
}

cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attr, int device) {
  if (device != 0) return set_error(cudaErrorInvalidDevice);
  switch (attr) {
    case cudaDevAttrMultiProcessorCount: *value = config().sm_count; break;
    case cudaDevAttrMaxThreadsPerBlock: *value = 1024; break;
    case cudaDevAttrMaxBlockDimX:
    case cudaDevAttrMaxBlockDimY: *value = 1024; break;
    case cudaDevAttrMaxBlockDimZ: *value = 64; break;
    case cudaDevAttrMaxGridDimX: *value = static_cast<int>(config().max_grid_x); break;
    case cudaDevAttrMaxGridDimY:
    case cudaDevAttrMaxGridDimZ: *value = 65535; break;
    case cudaDevAttrMaxSharedMemoryPerBlock: *value = static_cast<int>(default_shared_limit); break;
    case cudaDevAttrMaxSharedMemoryPerBlockOptin: *value = static_cast<int>(optin_shared_limit); break;
    case cudaDevAttrWarpSize: *value = 32; break;
    case cudaDevAttrMaxRegistersPerBlock: *value = 65536; break;
    case cudaDevAttrComputeCapabilityMajor: *value = 9; break;
    case cudaDevAttrComputeCapabilityMinor: *value = 0; break;
    case cudaDevAttrMaxThreadsPerMultiProcessor: *value = 2048; break;
    case cudaDevAttrCooperativeLaunch: *value = config().cooperative_launch ? 1 : 0; break;
    default:
      return complain(cudaErrorInvalidValue, "cudaDeviceGetAttribute: attribute " + std::to_string(attr) +
                                                 " is not emulated (add it to tests/simt/runtime.cpp)");
  }
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device != 0) return set_error(cudaErrorInvalidDevice);
  *prop = cudaDeviceProp{};
  std::snprintf(prop->name, sizeof prop->name, "gradzip SIMT (CPU emulation of sm_90)");
  prop->totalGlobalMem = std::size_t{16} << 30;
  prop->sharedMemPerBlock = default_shared_limit;
  prop->sharedMemPerBlockOptin = optin_shared_limit;
  prop->regsPerBlock = 65536;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  prop->maxThreadsDim[0] = prop->maxThreadsDim[1] = 1024;
  prop->maxThreadsDim[2] = 64;
  prop->maxGridSize[0] = static_cast<int>(config().max_grid_x);
  prop->maxGridSize[1] = prop->maxGridSize[2] = 65535;
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = config().sm_count;
  prop->maxThreadsPerMultiProcessor = 2048;
  prop->unifiedAddressing = 1;
  prop->memoryPoolsSupported = 1;
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize() {
  lock_t lock(runtime_mutex());
  ++host_wait_count;
  flush_all();
  return take_pending();
}

cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* blocks, const void* func, int block_size,
                                                          std::size_t dynamic_shared_bytes) {
  if (blocks == nullptr || func == nullptr || block_size <= 0 || block_size > 1024) {
    return report(cudaErrorInvalidValue, "cudaOccupancyMaxActiveBlocksPerMultiprocessor: a null pointer or a block size of " +
                                             std::to_string(block_size));
  }
  (void)dynamic_shared_bytes;
  *blocks = config().blocks_per_sm;  // the backend knows no registers: the configured answer for every kernel
  return cudaSuccess;
}

// What cuda_runtime.h's template overload calls.
cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessorWithFlags(int* blocks, const void* func, int block_size,
                                                                   std::size_t dynamic_shared_bytes, unsigned int) {
  return cudaOccupancyMaxActiveBlocksPerMultiprocessor(blocks, func, block_size, dynamic_shared_bytes);
}

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  lock_t lock(runtime_mutex());
  if (attr != cudaFuncAttributeMaxDynamicSharedMemorySize) return cudaSuccess;
  if (value < 0 || static_cast<std::size_t>(value) > optin_shared_limit) return set_error(cudaErrorInvalidValue);
  max_dynamic_shared()[func] = value;
  return cudaSuccess;
}

// ---- memory ----

cudaError_t cudaMalloc(void** p, std::size_t bytes) {
  lock_t lock(runtime_mutex());
  *p = allocate(bytes, false);
  return *p == nullptr ? set_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  lock_t lock(runtime_mutex());
  if (p == nullptr) return cudaSuccess;
  ++host_wait_count;
  flush_all();  // cudaFree synchronizes the device
  if (!release(p, false)) return complain(cudaErrorInvalidValue, "cudaFree of a pointer cudaMalloc did not return");
  return take_pending();
}

cudaError_t cudaMallocHost(void** p, std::size_t bytes) {
  lock_t lock(runtime_mutex());
  *p = allocate(bytes, true);
  return *p == nullptr ? set_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeHost(void* p) {
  lock_t lock(runtime_mutex());
  if (p == nullptr) return cudaSuccess;
  flush_all();
  return release(p, true) ? cudaSuccess : complain(cudaErrorInvalidValue, "cudaFreeHost of a pointer cudaMallocHost did not return");
}

cudaError_t cudaMallocAsync(void** p, std::size_t bytes, cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  if (stream_of(stream) == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  *p = allocate(bytes, false);  // usable by work enqueued on the stream from now on
  return *p == nullptr ? set_error(cudaErrorMemoryAllocation) : cudaSuccess;
}

cudaError_t cudaFreeAsync(void* p, cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  if (p == nullptr) return cudaSuccess;
  if (find_allocation(p, 1, false) == nullptr) {
    return complain(cudaErrorInvalidValue, "cudaFreeAsync of a pointer cudaMalloc(Async) did not return");
  }
  enqueue(*s, [p] { release(p, false); });  // freed when the stream reaches it
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind) {
  lock_t lock(runtime_mutex());
  if (const cudaError_t e = check_copy("cudaMemcpy", dst, src, bytes, kind); e != cudaSuccess) return e;
  CUstream_st& s = legacy_stream();
  enqueue_copy(s, dst, src, bytes, kind);
  ++host_wait_count;
  flush(s, s.enqueued);
  return take_pending();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, std::size_t bytes, cudaMemcpyKind kind, cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  if (const cudaError_t e = check_copy("cudaMemcpyAsync", dst, src, bytes, kind); e != cudaSuccess) return e;
  enqueue_copy(*s, dst, src, bytes, kind);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, std::size_t bytes, cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  if (bytes != 0 && !is_device(p, bytes)) return complain(cudaErrorInvalidValue, bad_range("cudaMemsetAsync", "range", p, bytes));
  enqueue(*s, [p, value, bytes] { std::memset(p, value, bytes); });
  return cudaSuccess;
}

/// Like cudaMemsetAsync on the legacy stream: asynchronous to the host for device memory.
cudaError_t cudaMemset(void* p, int value, std::size_t bytes) {
  return cudaMemsetAsync(p, value, bytes, nullptr);
}

// ---- streams and events ----

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int flags) {
  lock_t lock(runtime_mutex());
  auto s = std::make_unique<CUstream_st>();
  s->flags = flags;
  *stream = s.get();
  streams().push_back(std::move(s));
  return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t* stream) { return cudaStreamCreateWithFlags(stream, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr || s->legacy) return set_error(cudaErrorInvalidResourceHandle);
  flush(*s, s->enqueued);  // its work still completes
  s->destroyed = true;     // kept: events and other streams may still name it
  return take_pending();
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  ++host_wait_count;
  flush(*s, s->enqueued);
  return take_pending();
}

cudaError_t cudaStreamQuery(cudaStream_t stream) { return cudaStreamSynchronize(stream); }

cudaError_t cudaEventCreate(cudaEvent_t* event) {
  lock_t lock(runtime_mutex());
  *event = new CUevent_st;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) { return cudaEventCreate(event); }

cudaError_t cudaEventDestroy(cudaEvent_t event) {
  lock_t lock(runtime_mutex());
  delete event;
  return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr || event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  event->recorded = true;
  event->completed = false;
  event->stream = s;
  event->seq = enqueue(*s, [event] {
    event->completed = true;
    event->when = std::chrono::steady_clock::now();
  });
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned int) {
  lock_t lock(runtime_mutex());
  CUstream_st* s = stream_of(stream);
  if (s == nullptr || event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  const std::uint64_t seq = enqueue(*s, [] {});
  if (event->recorded) s->queue.back().after.emplace_back(event->stream, event->seq);
  (void)seq;
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t event) {
  lock_t lock(runtime_mutex());
  if (event == nullptr) return set_error(cudaErrorInvalidResourceHandle);
  ++host_wait_count;
  if (event->recorded) flush(*event->stream, event->seq);
  return take_pending();
}

cudaError_t cudaEventQuery(cudaEvent_t event) { return cudaEventSynchronize(event); }

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t start, cudaEvent_t end) {
  lock_t lock(runtime_mutex());
  if (!start->completed || !end->completed) return set_error(cudaErrorNotReady);
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}

}  // extern "C"
