// gradzip quick start (CUDA): the same codec on a stream, producing the host's bytes.
#include <gradzip/gradzip.cuh>

#include <cstdio>
#include <vector>

__global__ void fill(float* g, std::size_t n) {
  for (std::size_t i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    g[i] = __sinf(0.001f * i) * __expf(-1e-5f * i);
  }
}

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("no CUDA device: nothing to run\n");
    return 0;
  }
  const std::size_t n = 1 << 24;
  const gradzip::codec<gradzip::sparsify::topk> codec{gradzip::sparsify::topk::ratio(0.01)};

  cudaStream_t stream;
  GRADZIP_CUDA_TRY(cudaStreamCreate(&stream));
  {
  gradzip::cuda exec{stream};  // owns stream-ordered scratch and the decode status word
  exec.reserve(codec.workspace_bytes<float>(exec, n));

  float *grad = nullptr, *accum = nullptr;
  std::byte* payload = nullptr;
  const std::size_t capacity = codec.max_compressed_bytes<float>(n);
  GRADZIP_CUDA_TRY(cudaMalloc(&grad, n * sizeof(float)));
  GRADZIP_CUDA_TRY(cudaMalloc(&accum, n * sizeof(float)));
  GRADZIP_CUDA_TRY(cudaMalloc(&payload, capacity));
  GRADZIP_CUDA_TRY(cudaMemsetAsync(accum, 0, n * sizeof(float), stream));
  fill<<<1024, 256, 0, stream>>>(grad, n);

  // Both calls only enqueue work on the stream: no host synchronization.
  const std::size_t bytes = codec.compress(exec, gradzip::span<const float>(grad, n),
                                           gradzip::span<std::byte>(payload, capacity));
  codec.decompress_add(exec, gradzip::span<const std::byte>(payload, bytes),
                       gradzip::span<float>(accum, n));
  exec.check();  // synchronizes; throws gradzip::format_error if a payload was bad

  std::printf("%zu floats -> %zu bytes on the GPU (%.1fx smaller)\n", n, bytes,
              double(n * sizeof(float)) / bytes);
  cudaFree(grad);
  cudaFree(accum);
  cudaFree(payload);
  }  // the executor returns its scratch on the stream before the stream goes
  cudaStreamDestroy(stream);
  return 0;
}
