// The SIMT backend's CUB: this path shadows the real <cub/device/device_radix_sort.cuh> in SIMT builds.
#pragma once
#include "gradzip_simt/cub.hpp"
