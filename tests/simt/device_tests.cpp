// tests/device/test_device.cu compiled by the host compiler for the SIMT backend: the same test
// cases that run on a GPU (label gpu) run here with every kernel executed on the CPU.
#include "device/test_device.cu"
