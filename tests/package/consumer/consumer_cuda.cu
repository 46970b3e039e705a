// A plain .cu consumer: device compress and decode through gradzip's public API.
#include <gradzip/gradzip.cuh>

#include <cstdio>
#include <vector>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("consumer (cuda): built; no GPU to run on\n");
    return 0;
  }
  const gradzip::codec<gradzip::sparsify::topk> c{gradzip::sparsify::topk::count(1)};
  gradzip::cuda exec;
  const std::vector<float> x = {1, -5, 2};
  float* dx = nullptr;
  std::byte* dout = nullptr;
  const std::size_t bound = c.max_compressed_bytes<float>(x.size());
  GRADZIP_CUDA_TRY(cudaMalloc(&dx, x.size() * sizeof(float)));
  GRADZIP_CUDA_TRY(cudaMalloc(&dout, bound));
  GRADZIP_CUDA_TRY(cudaMemcpy(dx, x.data(), x.size() * sizeof(float), cudaMemcpyHostToDevice));
  const std::size_t bytes = c.compress(exec, gradzip::span<const float>(dx, x.size()), gradzip::span<std::byte>(dout, bound));
  c.decompress(exec, gradzip::span<const std::byte>(dout, bytes), gradzip::span<float>(dx, x.size()));
  exec.check();
  std::vector<float> y(x.size());
  GRADZIP_CUDA_TRY(cudaMemcpy(y.data(), dx, y.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(dx);
  cudaFree(dout);
  std::printf("consumer (cuda): %zu bytes, y[1] = %g\n", bytes, y[1]);
  return y[1] == -5.0f ? 0 : 1;
}
