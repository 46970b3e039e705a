// Catch2's main for the SIMT test binaries: the --simt-* options set how kernels run (thread
// and block order, strict barriers, the emulated device's size); the rest goes to Catch2.
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include "gradzip_simt/settings.hpp"

int main(int argc, char** argv) {
  argc = gradzip_simt::parse_options(argc, argv);
  return Catch::Session().run(argc, argv);
}
