// Compiled by ctest twice: with ELEMENT=float it must compile; with ELEMENT=int the first error
// must be the wrapper's static_assert naming the element type (tests/CMakeLists.txt).
#include <gradzip/gradzip.hpp>

using codec_t = gradzip::codec<gradzip::sparsify::topk>;

int main() {
  gradzip::host exec;
  gradzip::feedback::error_feedback<codec_t, ELEMENT, gradzip::host> ef(exec, codec_t{gradzip::sparsify::topk::count(1)}, 4);
  return ef.max_compressed_bytes<ELEMENT>() > 0 ? 0 : 1;
}
