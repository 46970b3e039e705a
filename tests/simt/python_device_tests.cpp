// tests/device/test_python_device.cu (the Python module's CUDA half) compiled by the host
// compiler for the SIMT backend.
#include "device/test_python_device.cu"
