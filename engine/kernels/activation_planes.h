// How the residual activation plane relates to the first (kernels.h,
// ActivationQ8): shared by the quantizer, the kernels and their tests.
#pragma once

#include <cstdint>

namespace colibri::kernels {

// The residual plane's scale is the first plane's divided by this, exactly: a
// power of two, so the Q8R16 kernels can add the planes' integer dots.
inline constexpr std::int32_t kResidualRatio = 128;
// Its codes' bound: the residual is at most half the first plane's step.
inline constexpr std::int32_t kResidualLimit = kResidualRatio / 2;

}  // namespace colibri::kernels
