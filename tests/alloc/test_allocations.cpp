// "No allocation after reserve", checked: this binary replaces the global operator new and counts
// the allocations a host executor's calls make once its scratch is reserved.
#include <catch2/catch.hpp>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "common/synthetic_gradient.hpp"
#include "gradzip/gradzip.hpp"

namespace {
std::atomic<std::size_t> allocations{0};

void* counted(std::size_t bytes, std::size_t alignment) {
  ++allocations;
  void* p = alignment <= alignof(std::max_align_t) ? std::malloc(bytes == 0 ? 1 : bytes)
                                                   : std::aligned_alloc(alignment, (bytes + alignment - 1) / alignment * alignment);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t bytes) { return counted(bytes, 0); }
void* operator new[](std::size_t bytes) { return counted(bytes, 0); }
void* operator new(std::size_t bytes, std::align_val_t a) { return counted(bytes, static_cast<std::size_t>(a)); }
void* operator new[](std::size_t bytes, std::align_val_t a) { return counted(bytes, static_cast<std::size_t>(a)); }
void operator delete(void* p) noexcept { std::free(p); }
void operator delete[](void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }
void operator delete[](void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace gz = gradzip;

namespace {

/// reserve(workspace_bytes), then two compress + decompress_add steps: no allocation at all.
template <class Codec>
void check_no_allocation(const char* name, const Codec& c, std::size_t n) {
  INFO(name);
  const auto x = gradzip_tools::synthetic_gradient<float>(n, 5);
  std::vector<std::byte> out(c.template max_compressed_bytes<float>(n));
  std::vector<float> acc(n);
  {  // first-use allocations (the OpenMP runtime, the pool's helper threads) happen here
    gz::host warm;
    c.compress(warm, gz::span<const float>(x), gz::span<std::byte>(out));
  }
  gz::host exec;
  exec.reserve(c.template workspace_bytes<float>(exec, n));
  const std::size_t before = allocations.load();
  for (int step = 0; step < 2; ++step) {
    const std::size_t bytes = c.compress(exec, gz::span<const float>(x), gz::span<std::byte>(out), {static_cast<std::uint32_t>(step), 0});
    c.decompress_add(exec, gz::span<const std::byte>(out.data(), bytes), gz::span<float>(acc));
  }
  CHECK(allocations.load() - before == 0);
}

}  // namespace

TEST_CASE("host compress and decompress_add allocate nothing after reserve", "[host]") {
  const std::size_t n = 300000;
  check_no_allocation("topk", gz::codec<gz::sparsify::topk>{gz::sparsify::topk::ratio(0.01)}, n);
  check_no_allocation("dense qsgd", gz::codec<gz::sparsify::none, gz::quantize::qsgd<7>, gz::encode::none>{}, n);
  check_no_allocation("threshold", gz::codec<gz::sparsify::threshold>{gz::sparsify::threshold{0.5}}, n);
  check_no_allocation("sampled top-k, delta-varint",
                      gz::codec<gz::sparsify::sampled_topk, gz::quantize::none, gz::encode::delta_varint>{
                          gz::sparsify::sampled_topk::ratio(0.01)}, n);
  check_no_allocation("random-k, uniform 4-bit", gz::codec<gz::sparsify::randomk, gz::quantize::uniform<4>, gz::encode::none>{
                          gz::sparsify::randomk::ratio(0.01, 3)}, n);
  check_no_allocation("top-k, uniform 4-bit, automatic",
                      gz::codec<gz::sparsify::topk, gz::quantize::uniform<4>, gz::encode::automatic>{
                          gz::sparsify::topk::ratio(0.01)}, n);
}
