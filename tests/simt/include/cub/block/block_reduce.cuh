// The SIMT backend's CUB: this path shadows the real <cub/block/block_reduce.cuh> in SIMT builds.
#pragma once
#include "gradzip_simt/cub.hpp"
