// Register-only chains of multiply-adds: how fast a core multiplies with no memory in the
// way. The roofline's arithmetic peak runs them on every thread (roofline.h); matvec asks
// once which of two ways to multiply bfloat16 this CPU runs faster.
#pragma once
#include <cstdint>

namespace kvevict {

// Independent multiply-add chains per call: 12 cover a 4-cycle FMA latency on two ports
// with room to spare. acc = acc * m + c converges to c / (1 - m) = 1: no overflow, no
// denormals. The chains live in registers (the inner loop is unrolled), so no load or
// store is timed. Each runs `n` steps of every chain and returns their sum (positive),
// which keeps them alive.
constexpr int kMultiplyAddChains = 12;
float fma_chains_portable(int64_t n);  // 2 FLOPs a chain step
#if defined(__x86_64__) && defined(__GNUC__)
float fma_chains_avx2(int64_t n);    // 16 FLOPs a chain step; the CPU must have AVX2 and FMA
float fma_chains_avx512(int64_t n);  // 32; AVX-512F
float bf16_dot_chains(int64_t n);    // 64 (vdpbf16ps); AVX512-BF16
#endif

// Whether this CPU's vdpbf16ps does 32 multiply-adds of bfloat16 pairs in less time than
// two float32 FMAs do (on bfloat16 values widened to float32, which is exact): measured
// once, on the calling thread, in about 0.1 ms. False where the CPU lacks AVX512-BF16.
bool bf16_dot_outruns_fma();

}  // namespace kvevict
