// Fashion-MNIST in IDX format (gzipped), as Debian's dataset-fashion-mnist installs it, and the
// command-line loop, for the MPI examples (mpi_train, zen_embedding). Needs zlib.
#pragma once

#include <zlib.h>

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace fashion_mnist {

struct dataset {
  std::vector<float> images;  // count x 784, scaled to [0, 1]
  std::vector<std::uint8_t> labels;
  std::size_t count = 0;
};

inline std::uint32_t big_endian(const unsigned char* p) {
  return (std::uint32_t{p[0]} << 24) | (std::uint32_t{p[1]} << 16) | (std::uint32_t{p[2]} << 8) | p[3];
}

inline std::vector<unsigned char> read_gz(const std::string& path) {
  gzFile f = gzopen(path.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + path + " (Debian: apt-get install dataset-fashion-mnist)");
  std::vector<unsigned char> out;
  unsigned char buffer[1 << 16];
  int got = 0;
  while ((got = gzread(f, buffer, sizeof buffer)) > 0) out.insert(out.end(), buffer, buffer + got);
  gzclose(f);
  if (got < 0) throw std::runtime_error("cannot decompress " + path);
  return out;
}

inline dataset load(const std::string& dir, const std::string& prefix, std::size_t limit) {
  const auto images = read_gz(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  const auto labels = read_gz(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  if (images.size() < 16 || big_endian(images.data()) != 0x803 || labels.size() < 8 ||
      big_endian(labels.data()) != 0x801) {
    throw std::runtime_error("not IDX image/label files: " + dir + "/" + prefix);
  }
  dataset d;
  d.count = std::min<std::size_t>({big_endian(images.data() + 4), big_endian(labels.data() + 4), limit});
  if (big_endian(images.data() + 8) != 28 || big_endian(images.data() + 12) != 28 ||
      images.size() < 16 + d.count * 784 || labels.size() < 8 + d.count) {
    throw std::runtime_error("unexpected IDX shape in " + dir + "/" + prefix);
  }
  d.images.resize(d.count * 784);
  for (std::size_t i = 0; i < d.images.size(); ++i) d.images[i] = images[16 + i] / 255.0f;
  d.labels.assign(labels.begin() + 8, labels.begin() + 8 + static_cast<std::ptrdiff_t>(d.count));
  return d;
}

/// Calls handle(option, value) for each argument; `value()` takes the next one as the option's
/// value. handle returns false for an option it does not know, which throws.
template <class Handle>
void parse_options(int argc, char** argv, Handle handle) {
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto value = [&]() -> std::string {
      if (i + 1 >= argc) throw std::runtime_error(a + " needs a value");
      return argv[++i];
    };
    if (!handle(a, value)) throw std::runtime_error("unknown option " + a);
  }
}

}  // namespace fashion_mnist
