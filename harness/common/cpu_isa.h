// Which vector loops the hand-written kernels outside ATen take: the exponentials
// (float_row_exp.h, double_exp.h) and the policy softmax's passes (slot_softmax.h). Each
// gives the same bits in every loop, so the choice changes speed only.
#pragma once

namespace kvevict {

// The CPU has AVX2 and FMA: the vector loops run.
bool cpu_has_avx2_fma();
// Their sixteen-float (eight-double) loops run: the CPU has AVX-512 and
// ATEN_CPU_CAPABILITY is not avx2 or default, as for matvec.h's kernels.
bool use_avx512();

}  // namespace kvevict
