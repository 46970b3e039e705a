/**
 * @file gradzip.cuh
 * @brief Everything in gradzip.hpp plus the CUDA executor `gradzip::cuda` and its kernels.
 *
 * Include from `.cu` files compiled by nvcc. Note: `gradzip::cuda` is the executor, so inside a
 * `using namespace gradzip;` scope write `::cuda::std` for libcu++.
 */
#pragma once

#include "gradzip/gradzip.hpp"
#include "gradzip/core/cuda.cuh"
