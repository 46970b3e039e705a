// tools/check_kernels.py's own test: a kernel bounded to 128 threads with 40 KiB of static shared
// memory, checked against the launch records beside this file (what the SIMT backend writes with
// --simt-record-launches). Each record breaks one rule, but one keeps to all; none launches the
// int instantiation.
namespace gradzip::check_kernels_test {

template <class T>
__global__ void __launch_bounds__(128) bounded_kernel(T* out) {
  __shared__ T tile[10240];  // 40 KiB
  tile[threadIdx.x] = out[threadIdx.x];
  __syncthreads();
  out[threadIdx.x] = tile[(threadIdx.x + 1) % blockDim.x];
}

template __global__ void bounded_kernel<float>(float*);
template __global__ void bounded_kernel<int>(int*);  // in no record: unchecked, or with --all-launched a failure

}  // namespace gradzip::check_kernels_test
