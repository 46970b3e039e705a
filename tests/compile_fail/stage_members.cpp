// Compiled by ctest with -DCASE=0..3: case 0 (every stage complete) must compile; in cases 1-3
// one member is missing and the first error must be stage.hpp's static_assert naming it
// (tests/CMakeLists.txt).
#include <gradzip/gradzip.hpp>

namespace gz = gradzip;

/// An element-wise values stage: values as float, negated (a stand-in for a user's stage).
struct negated {
  static constexpr std::uint8_t id = gz::stage::first_user_id;
  static constexpr bool summable = true;
  static constexpr std::uint64_t param_bytes = 0;
  static void write_params(std::uint8_t*) {}
  static gz::wire::status check_params(const std::uint8_t*, std::uint64_t) { return {}; }
  static std::uint64_t value_size(gz::element_type) { return 4; }
#if CASE != 1
  template <class T>
  static void store(std::uint8_t* section, std::uint64_t pos, T value) {
    const float f = -static_cast<float>(gz::to_float(value));
    std::memcpy(section + pos * 4, &f, 4);
  }
#endif
  static double load(const std::uint8_t* section, gz::element_type, std::uint64_t pos) {
    float f;
    std::memcpy(&f, section + pos * 4, 4);
    return -f;
  }
};

/// A bucketed values stage: 8-bit codes of v / max|v| per bucket.
struct scaled8 : gz::quantize::bucketed_stage<8, 64, float> {
  static constexpr std::uint8_t id = gz::stage::first_user_id + 1;
  static constexpr bool summable = false;
  static constexpr std::uint64_t param_bytes = 0;
  static void write_params(std::uint8_t*) {}
  static gz::wire::status check_params(const std::uint8_t*, std::uint64_t) { return {}; }
  static gz::quantize::bucket_stats empty_stats() { return {{0.0f, 0.0f, 0.0f, 0.0f}}; }
  static void add(gz::quantize::bucket_stats& s, float v) { s.v[0] = gz::quantize::stat_max(s.v[0], v < 0 ? -v : v); }
  static gz::quantize::bucket_stats merge(gz::quantize::bucket_stats a, gz::quantize::bucket_stats b) {
    return {{gz::quantize::stat_max(a.v[0], b.v[0]), 0.0f, 0.0f, 0.0f}};
  }
#if CASE != 2
  static float make_record(gz::quantize::bucket_stats s, std::uint64_t) { return s.v[0]; }
#endif
  unsigned encode(float v, const float& r, std::uint32_t) const {
    return r > 0.0f ? static_cast<unsigned>((v / r + 1.0f) * 127.5f) : 0u;
  }
  static float decode(unsigned code, const float& r) { return (static_cast<float>(code) / 127.5f - 1.0f) * r; }
};

/// A structure stage that forgets selected_count in case 3.
struct every_element : gz::sparsify::none {
#if CASE == 3
  std::uint64_t selected_count(std::uint64_t) const = delete;
#endif
};

int main() {
  gz::host exec;
  const gz::codec<gz::sparsify::topk, negated> a{gz::sparsify::topk::count(2)};
  const gz::codec<gz::sparsify::none, scaled8, gz::encode::none> b;
  const gz::codec<every_element, gz::quantize::none, gz::encode::none> c;
  return a.max_compressed_bytes<float>(8) + b.max_compressed_bytes<float>(8) + c.max_compressed_bytes<float>(8) > 0 ? 0 : 1;
}
