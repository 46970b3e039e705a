// The executor's status word as kernels use it: the first failure is recorded with an atomic, and
// every read of its code while a launch may be recording one is a relaxed atomic load.
#pragma once

#include "gradzip/wire/format.hpp"

namespace gradzip::detail {

static_assert(sizeof(wire::format_errc) == sizeof(unsigned int), "the status code is one 32-bit word");

/// Records the first failure: only the thread that claims the empty word writes the numbers. For
/// failures only one thread can meet (a frame checked by one thread); where many threads check
/// many positions, note_failure and settle pick the one the host reports. The numbers (a, b, c)
/// are plain stores: only the host and later launches read them.
__device__ inline void record_failure(wire::status* st, const wire::status& s) {
  auto* code = reinterpret_cast<unsigned int*>(&st->code);
  if (atomicCAS(code, 0u, static_cast<unsigned int>(s.code)) == 0u) {
    st->a = s.a;
    st->b = s.b;
    st->c = s.c;
  }
}

/// Whether the status word holds a failure. Another thread of the same launch may be recording
/// one (record_failure's atomicCAS), and a plain load beside that atomic write is a data race in
/// CUDA's memory model, so the code is read as a relaxed atomic: ld.relaxed.gpu on the device,
/// its host twin under the SIMT backend (where ThreadSanitizer reports the plain load). Kernels
/// read the code only through this; seeing a failure late only costs work the failure discards.
__device__ inline bool failure_recorded(const wire::status* st) {
  const auto* word = reinterpret_cast<const unsigned int*>(&st->code);
#if defined(__CUDA_ARCH__)
  unsigned int code;
  asm volatile("ld.relaxed.gpu.u32 %0, [%1];" : "=r"(code) : "l"(word) : "memory");
#else
  const unsigned int code = __atomic_load_n(word, __ATOMIC_RELAXED);
#endif
  return code != static_cast<unsigned int>(wire::format_errc::ok);
}

}  // namespace gradzip::detail
