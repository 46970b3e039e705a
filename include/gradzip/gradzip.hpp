/**
 * @file gradzip.hpp
 * @brief Everything gradzip offers to host code (compiles with g++ or clang++ alone).
 *
 * For the CUDA executor and kernels, include `gradzip/gradzip.cuh` from a `.cu` file instead.
 */
#pragma once

#include "gradzip/codec.hpp"
#include "gradzip/core/config.hpp"
#include "gradzip/core/element_type.hpp"
#include "gradzip/core/error.hpp"
#include "gradzip/core/executor.hpp"
#include "gradzip/core/span.hpp"
#include "gradzip/encode/automatic.hpp"
#include "gradzip/encode/bitmap.hpp"
#include "gradzip/encode/coo.hpp"
#include "gradzip/encode/delta_varint.hpp"
#include "gradzip/encode/none.hpp"
#include "gradzip/feedback/error_feedback.hpp"
#include "gradzip/feedback/momentum_correction.hpp"
#include "gradzip/feedback/signum.hpp"
#include "gradzip/quantize/cast.hpp"
#include "gradzip/quantize/float_formats.hpp"
#include "gradzip/quantize/majority_vote.hpp"
#include "gradzip/quantize/natural.hpp"
#include "gradzip/quantize/none.hpp"
#include "gradzip/quantize/qsgd.hpp"
#include "gradzip/quantize/onebit.hpp"
#include "gradzip/quantize/sign.hpp"
#include "gradzip/quantize/terngrad.hpp"
#include "gradzip/quantize/uniform.hpp"
#include "gradzip/random/hash.hpp"
#include "gradzip/random/philox.hpp"
#include "gradzip/sparsify/blockwise_topk.hpp"
#include "gradzip/sparsify/none.hpp"
#include "gradzip/sparsify/randomk.hpp"
#include "gradzip/sparsify/sampled_topk.hpp"
#include "gradzip/sparsify/threshold.hpp"
#include "gradzip/sparsify/topk.hpp"
#include "gradzip/wire/checksum.hpp"
#include "gradzip/wire/format.hpp"
#include "gradzip/wire/reader.hpp"
#include "gradzip/wire/writer.hpp"
