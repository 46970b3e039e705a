// The CUDA executors behind the Python module's calls on CUDA tensors (GRADZIP_PYTHON_CUDA).
#include "device.cuh"

namespace gradzip_py {

void device_executor_deleter::operator()(device_executor* e) const noexcept { delete e; }

device_executor_ptr make_device_executor(int device) { return device_executor_ptr(new device_executor(device)); }

}  // namespace gradzip_py
