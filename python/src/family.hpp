// What a codec family's translation unit (codecs_*.cpp) includes: erase() and, in
// GRADZIP_PYTHON_CUDA builds (nvcc compiles these units), each erased codec's device half.
#pragma once

#include "erased.hpp"
#if GRADZIP_PYTHON_CUDA
#include "device.cuh"
#endif
