// LibTorch's tensor API without its training half: torch/types.h (ATen and the torch::
// tensor names) instead of torch/torch.h, which adds nn, optim, data and jit and takes
// about twice as long to parse in every file that includes it. This is also the header
// the LibTorch libraries precompile (CMakeLists.txt).
#pragma once
#include <torch/types.h>
#include <torch/utils.h>  // NoGradGuard, manual_seed
