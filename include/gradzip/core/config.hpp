/**
 * @file config.hpp
 * @brief Compiler macros shared by every gradzip header.
 *
 * `GRADZIP_HOST_DEVICE` marks the functions that hold an algorithm's math once for both
 * executors: under nvcc it expands to `__host__ __device__`, under a host compiler to nothing.
 */
#pragma once

#include <cstddef>
#include <cstdint>

#if defined(__CUDACC__)
#define GRADZIP_HOST_DEVICE __host__ __device__
#else
#define GRADZIP_HOST_DEVICE
#endif

#define GRADZIP_VERSION_MAJOR 0
#define GRADZIP_VERSION_MINOR 1
#define GRADZIP_VERSION_PATCH 0

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gradzip payloads store values in native byte order, which must be little-endian"
#endif

static_assert(sizeof(std::size_t) == 8, "gradzip needs 64-bit sizes (a 64-bit target)");
