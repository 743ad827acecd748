#include "harness/model/matvec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "harness/common/errors.h"
#include "harness/common/multiply_add_chains.h"
#include "harness/model/bfloat16_bits.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_MATVEC_AVX2 1
#endif

namespace kvevict {
namespace {

// Any CPU: 8 partial sums, so the compiler can keep them in one vector register.
template <typename W>
float dot_portable(const W* w, const float* x, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += widen(w[i + k]) * x[i + k];
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) sum += widen(w[i]) * x[i];
  return sum;
}

// Weight rows per block of the AVX2 block kernel, and x rows per block of every block
// kernel: 12 accumulators, the three weight vectors and one x vector fit AVX2's 16
// registers (measured on one thread against dot_rows_avx2 alone at batch 8: 1.2-1.4x on
// 768- and 2048-wide weights). AVX-512 blocks take kAvx512WeightRows.
constexpr int kBlockWeightRows = 3, kBlockXRows = 4;

#ifdef KVEVICT_MATVEC_AVX2
__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// The vector kernels' scalar tail: sum + w[j] * x[j] for j in [from, n), each one fused
// multiply-add, spelled out. Left to the compiler, the same line was contracted to a
// scalar FMA in one kernel and vectorised across rows as a rounded product and an add
// in another, and their sums differed in the last bit.
template <typename W>
__attribute__((target("avx2,fma"), always_inline)) inline float tail_sum(float sum, const W* w, const float* x,
                                                                       int64_t from, int64_t n) {
  for (int64_t j = from; j < n; ++j) sum = __builtin_fmaf(widen(w[j]), x[j], sum);
  return sum;
}

// One row is one sequential stream (what the hardware prefetcher follows best); four
// accumulators hide the FMA latency. x stays in L1.
template <typename W>
__attribute__((target("avx2,fma"))) float dot_avx2(const W* w, const float* x, int64_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
    a1 = _mm256_fmadd_ps(load8(w + i + 8), _mm256_loadu_ps(x + i + 8), a1);
    a2 = _mm256_fmadd_ps(load8(w + i + 16), _mm256_loadu_ps(x + i + 16), a2);
    a3 = _mm256_fmadd_ps(load8(w + i + 24), _mm256_loadu_ps(x + i + 24), a3);
  }
  for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8(w + i), _mm256_loadu_ps(x + i), a0);
  const __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  float sum = _mm_cvtss_f32(h);
  return tail_sum(sum, w, x, i, n);
}

// G rows of x against one weight row in one pass over it: each 32-float chunk of the
// weight is loaded (and for bfloat16 widened) once and multiplied into G rows. Every
// (weight row, x row) pair keeps its own four accumulators, summed in dot_avx2's order,
// so each output has dot_avx2's bits whatever G is. G <= 3: 12 accumulators and the
// weight chunk fit AVX2's 16 registers.
template <int G, typename W>
__attribute__((target("avx2,fma"))) void dot_rows_avx2(const W* w, const float* const* x, int64_t n, float* sums) {
  __m256 a[G][4];
  for (int g = 0; g < G; ++g) a[g][0] = a[g][1] = a[g][2] = a[g][3] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    for (int c = 0; c < 4; ++c) {
      const __m256 wc = load8(w + i + 8 * c);
      for (int g = 0; g < G; ++g) a[g][c] = _mm256_fmadd_ps(wc, _mm256_loadu_ps(x[g] + i + 8 * c), a[g][c]);
    }
  }
  for (; i + 8 <= n; i += 8) {
    const __m256 wc = load8(w + i);
    for (int g = 0; g < G; ++g) a[g][0] = _mm256_fmadd_ps(wc, _mm256_loadu_ps(x[g] + i), a[g][0]);
  }
  for (int g = 0; g < G; ++g) {
    const __m256 acc = _mm256_add_ps(_mm256_add_ps(a[g][0], a[g][1]), _mm256_add_ps(a[g][2], a[g][3]));
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
    float sum = _mm_cvtss_f32(h);
    sums[g] = tail_sum(sum, w, x[g], i, n);
  }
}

// While a block of R weight rows is multiplied, the next block (the R*n weights after
// it: a block's rows are contiguous, and so is the next block) is fetched into L2: the
// hardware prefetcher alone left a batch's multiplications waiting on memory (the AVX2
// kernel at batch 8 on 2 threads: 44 -> 34 ms a pass over the random 12 x 768 model).
// Not into L1: a float32 block and its x rows fill L1 already, and the next block evicted
// them (float32 on a 2-core Xeon, tokens/s: 1B shape batch 8 32.5 -> 36.1, batch 16
// 48.2 -> 51.4; 768 shape batch 8 239-252 -> 275; bfloat16 within the runs' noise).
// Each of the `parts` calls that go over a block (one per group of x rows) fetches its
// part, a few lines a loop step, so the fetch runs through the whole block's arithmetic:
// all of it in the first group's steps kept the memory idle for the rest (float32 on a
// 2-core Xeon, random 12 x 768 model: batch 32 377 -> 418 tokens/s, batch 8 214 -> 230).
// parts = 0: a block of one weight row (the bfloat16 kernels below four rows of x), whose
// next block is too close to fetch ahead of: each step fetches into L1 the line
// kStreamAheadBytes past the weights it reads (the rows are contiguous, so the stream runs
// on into the next rows). The hardware prefetcher alone left that stream short of the
// bandwidth. bfloat16 on 2 threads of the 2-core Xeon, interleaved rounds, tokens/s:
// 12 x 768 batch 1 83 -> 101 (4 KiB ahead; 8 to 16 KiB the same within the noise),
// batch 2 150 -> 190, batch 3 180 -> 245; the 1B shape (4 KiB rows) batch 1 10.8 and
// batch 2 20.0 with 4 KiB ahead, 11.2-11.9 and 22.4-22.6 with 16 KiB. Into L2 or as
// non-temporal it did less. A prefetch never faults, so the last block may reach past
// the weights.
constexpr int64_t kStreamAheadBytes = 16384;
struct PrefetchShare {
  const char* next = nullptr;  // the next line to fetch
  const char* end = nullptr;
  int64_t lines_per_step = 0;
  bool stream_ahead = false;
  template <typename W>
  PrefetchShare(const W* block_end, int64_t bytes, int part, int parts, int64_t steps) {
    if (steps <= 0) return;
    if (parts <= 0) {
      stream_ahead = true;
      return;
    }
    const char* start = reinterpret_cast<const char*>(block_end);
    next = start + bytes * part / parts / 64 * 64;
    end = start + bytes * (part + 1) / parts;
    const int64_t lines = (end - next + 63) / 64;
    lines_per_step = (lines + steps - 1) / steps;
  }
  // One loop step, whose last weight row reads at `reading`.
  __attribute__((always_inline)) inline void step(const void* reading) {
    if (stream_ahead) {
      _mm_prefetch(static_cast<const char*>(reading) + kStreamAheadBytes, _MM_HINT_T0);
      return;
    }
    for (int64_t k = 0; k < lines_per_step && next < end; ++k, next += 64) _mm_prefetch(next, _MM_HINT_T1);
  }
};

// One step of dot_block_avx2: the 8 floats at i of R weight rows times G rows of x, each
// weight and x vector loaded once for all the products it enters.
template <int R, int G, typename W>
__attribute__((target("avx2,fma"), always_inline)) inline void block_step(const W* const* w, const float* const* x,
                                                                       int64_t i, __m256 (&a)[R][G]) {
  __m256 wv[R];
  for (int r = 0; r < R; ++r) wv[r] = load8(w[r] + i);
  for (int g = 0; g < G; ++g) {
    const __m256 xv = _mm256_loadu_ps(x[g] + i);
    for (int r = 0; r < R; ++r) a[r][g] = _mm256_fmadd_ps(wv[r], xv, a[r][g]);
  }
}

// R weight rows against G rows of x, with dot_avx2's bits for every pair. dot_avx2's four
// accumulators are independent sums (accumulator c takes the floats at 8c .. 8c+7 of
// each 32), so they are computed one after the other, each for all R x G pairs: R*G
// registers instead of 4*G, and one load feeds G (weight) or R (x) products instead of
// G or 1. sums[r * stride + g] gets the sum of weight row r and x row g.
template <int R, int G, typename W>
__attribute__((target("avx2,fma"))) void dot_block_avx2(const W* const* w, const float* const* x, int64_t n,
                                                        float* sums, int64_t stride, int prefetch_part,
                                                        int prefetch_parts) {
  __m256 part[4][R][G];  // [accumulator][weight row][x row]
  const int64_t whole = n / 32 * 32;
  PrefetchShare share(w[R - 1] + n, R * n * int64_t(sizeof(W)), prefetch_part, prefetch_parts, 4 * (whole / 32));
  int64_t tail = whole;  // after accumulator 0's 8-float steps: where the scalar tail starts
  for (int c = 0; c < 4; ++c) {
    __m256 a[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) a[r][g] = _mm256_setzero_ps();
    for (int64_t i = 8 * c; i < whole; i += 32) {
      share.step(w[R - 1] + i);
      block_step<R, G>(w, x, i, a);
    }
    if (c == 0)
      for (; tail + 8 <= n; tail += 8) block_step<R, G>(w, x, tail, a);
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) part[c][r][g] = a[r][g];
  }
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      const __m256 acc =
          _mm256_add_ps(_mm256_add_ps(part[0][r][g], part[1][r][g]), _mm256_add_ps(part[2][r][g], part[3][r][g]));
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
      float sum = _mm_cvtss_f32(h);
      sums[r * stride + g] = tail_sum(sum, w[r], x[g], tail, n);
    }
}

// dot_avx2's sums with AVX-512: its four 8-float accumulators side by side, two to a
// 16-float register (low: accumulators 0 and 1, the floats 0..15 of every 32; high: 2
// and 3, the floats 16..31). Every lane takes the same FMAs in the same order as in
// dot_avx2, so every output has dot_avx2's bits, with half the instructions and one
// pass over the weights. R weight rows x G rows of x; sums[r * stride + g].
__attribute__((target("avx512f"))) inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
__attribute__((target("avx512f"))) inline __m512 load16(const uint16_t* p) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}

__attribute__((target("avx512f"), always_inline)) inline __m256 upper_half(__m512 v) {
  return _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1));
}

// The AVX-512 float32 block: R weight rows x G rows of x. The two halves of each 32-float
// step (accumulators 0|1, floats 0..15; 2|3, floats 16..31) are independent sums, so
// they run one after the other over the whole row: R*G registers a half instead of
// 2*R*G, which leaves room for six weight rows against four x rows with each x vector
// held in a register for its six products (a profile of batch 32 showed the previous 3 x 4
// block loading x once per product, 30 loads per 24 FMAs, more than the load ports take).
constexpr int kAvx512WeightRows = 6;

// Columns [from, to) (multiples of 32 below n / 32 * 32) of R weight rows x G rows of x,
// each pair's accumulators carried in `halves` (started at zero when `first`). Apart, the
// two halves run one after the other, each x vector held in a register for its R
// products; Together, both halves of each step run at once (2*R*G registers), so each
// weight row is read as one stream: what the memory-bound batches of one or two rows want.
// `share` fetches its part of the next block on the way: one step per 32 floats per half.
template <int R, int G, bool Together, int GS, typename W>
__attribute__((target("avx512f,avx2,fma"))) void block_columns_avx512(const W* const* w, const float* const* x,
                                                                      int64_t from, int64_t to, bool first,
                                                                      __m512 (&halves)[2][R][GS],
                                                                      PrefetchShare& share) {
  if constexpr (Together) {
    __m512 acc[2][R][G];
    for (int half = 0; half < 2; ++half)
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) acc[half][r][g] = first ? _mm512_setzero_ps() : halves[half][r][g];
    for (int64_t i = from; i < to; i += 32) {
      share.step(w[R - 1] + i);
      for (int half = 0; half < 2; ++half) {
        __m512 wv[R];
        for (int r = 0; r < R; ++r) wv[r] = load16(w[r] + i + 16 * half);
        for (int g = 0; g < G; ++g) {
          const __m512 xv = _mm512_loadu_ps(x[g] + i + 16 * half);
          for (int r = 0; r < R; ++r) acc[half][r][g] = _mm512_fmadd_ps(wv[r], xv, acc[half][r][g]);
        }
      }
    }
    for (int half = 0; half < 2; ++half)
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) halves[half][r][g] = acc[half][r][g];
    return;
  }
  for (int half = 0; half < 2; ++half) {
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = first ? _mm512_setzero_ps() : halves[half][r][g];
    for (int64_t i = from + 16 * half; i < to; i += 32) {
      share.step(w[R - 1] + i);
      __m512 wv[R];
      for (int r = 0; r < R; ++r) wv[r] = load16(w[r] + i);
      for (int g = 0; g < G; ++g) {
        __m512 xv = _mm512_loadu_ps(x[g] + i);
        asm("" : "+v"(xv));  // kept in a register for its R products, not reloaded as each one's operand
        for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(wv[r], xv, acc[r][g]);
      }
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) halves[half][r][g] = acc[r][g];
  }
}

// The block's sums from its accumulators: the 8-float and scalar tails past n / 32 * 32,
// then dot_avx2's final adds. sums[r * stride + g].
template <int R, int G, int GS, typename W>
__attribute__((target("avx512f,avx2,fma"))) void finish_block_avx512(const W* const* w, const float* const* x,
                                                                     int64_t n, const __m512 (&halves)[2][R][GS],
                                                                     float* sums, int64_t stride) {
  for (int r = 0; r < R; ++r)
    for (int g = 0; g < G; ++g) {
      __m256 a0 = _mm512_castps512_ps256(halves[0][r][g]), a1 = upper_half(halves[0][r][g]);
      const __m256 a2 = _mm512_castps512_ps256(halves[1][r][g]), a3 = upper_half(halves[1][r][g]);
      int64_t i = n / 32 * 32;
      for (; i + 8 <= n; i += 8) a0 = _mm256_fmadd_ps(load8(w[r] + i), _mm256_loadu_ps(x[g] + i), a0);
      const __m256 acc = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
      __m128 h = _mm_add_ps(_mm256_castps256_ps128(acc), _mm256_extractf128_ps(acc, 1));
      h = _mm_add_ps(h, _mm_movehl_ps(h, h));
      h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
      float sum = _mm_cvtss_f32(h);
      sums[r * stride + g] = tail_sum(sum, w[r], x[g], i, n);
    }
}

// R weight rows x G rows of x over the whole row: sums[r * stride + g].
template <int R, int G, bool Together, typename W>
__attribute__((target("avx512f,avx2,fma"))) void dot_block_avx512(const W* const* w, const float* const* x, int64_t n,
                                                                  float* sums, int64_t stride, int prefetch_part,
                                                                  int prefetch_parts) {
  __m512 halves[2][R][G];  // [half][weight row][x row]: accumulators 0|1, then 2|3
  const int64_t whole = n / 32 * 32;
  PrefetchShare share(w[R - 1] + n, R * n * int64_t(sizeof(W)), prefetch_part, prefetch_parts,
                      (Together ? 1 : 2) * (whole / 32));
  block_columns_avx512<R, G, Together>(w, x, 0, whole, true, halves, share);
  finish_block_avx512<R, G>(w, x, n, halves, sums, stride);
}

// Wide rows: R weight rows and a group of x rows no longer fit in L1 together (the
// 2048-wide 1B shape at batch 32: the six weight loads of each step had half the block
// kernel's samples), so the columns go in chunks: every x group of up to kChunkXRows rows
// takes a chunk while the block's share of it is in L1, each group's accumulators kept in
// `state` between chunks. Each accumulator takes the same FMAs in the same order, so the
// bits are those of the whole-row block (batch 32 of the 1B shape in float32 on the 2-core
// Xeon: 57 -> 66 tokens/s).
constexpr int64_t kChunkColumns = 512, kChunkXRows = 32, kL1BlockBytes = int64_t{32} << 10;

// fn(std::integral_constant<int, G>) for G = rows, 1 <= rows <= kBlockXRows: the block
// kernels take a group's x rows as a template argument.
template <class Fn>
void with_x_rows(int64_t rows, Fn&& fn) {
  static_assert(kBlockXRows == 4, "the cases below");
  switch (rows) {
    case 4: fn(std::integral_constant<int, 4>{}); break;
    case 3: fn(std::integral_constant<int, 3>{}); break;
    case 2: fn(std::integral_constant<int, 2>{}); break;
    default: fn(std::integral_constant<int, 1>{}); break;
  }
}

// The column chunks' order, for every chunked kernel: for each run of up to kChunkXRows
// rows of x, each chunk of columns [from, to) of whole goes through every group of up to
// kBlockXRows rows, columns(rows, b, group, from, to, first, part, parts) with `part` of
// `parts` the group's share of the next block's prefetch; then finish(rows, b, group)
// turns each group's accumulators into its sums. `group` indexes a run's groups.
template <class Columns, class Finish>
void for_column_chunks(int64_t batch, int64_t whole, Columns&& columns, Finish&& finish) {
  const int64_t chunks = (whole + kChunkColumns - 1) / kChunkColumns;
  const int64_t groups = (batch + kBlockXRows - 1) / kBlockXRows;
  const int parts = int(chunks * groups);  // prefetch parts: one per (chunk, x group) call
  for (int64_t b0 = 0; b0 < batch; b0 += kChunkXRows) {
    const int64_t end = std::min(batch, b0 + kChunkXRows);
    for (int64_t c = 0; c < chunks; ++c) {
      const int64_t from = c * kChunkColumns, to = std::min(whole, from + kChunkColumns);
      for (int64_t b = b0; b < end; b += kBlockXRows)
        columns(std::min<int64_t>(kBlockXRows, end - b), b, int((b - b0) / kBlockXRows), from, to, c == 0,
                int(c * groups + b / kBlockXRows), parts);
    }
    for (int64_t b = b0; b < end; b += kBlockXRows)
      finish(std::min<int64_t>(kBlockXRows, end - b), b, int((b - b0) / kBlockXRows));
  }
}

template <int R, typename W>
void weight_rows_avx512_chunked(const W* const* w, const float* const* x, int64_t batch, int64_t n, float* sums) {
  __m512 state[kChunkXRows / kBlockXRows][2][R][kBlockXRows];  // [x group][half][weight row][x row]
  for_column_chunks(
      batch, n / 32 * 32,
      [&](int64_t rows, int64_t b, int group, int64_t from, int64_t to, bool first, int part, int parts) {
        PrefetchShare share(w[R - 1] + n, R * n * int64_t(sizeof(W)), part, parts, 2 * ((to - from) / 32));
        with_x_rows(rows, [&](auto G) {
          block_columns_avx512<R, decltype(G)::value, false>(w, x + b, from, to, first, state[group], share);
        });
      },
      [&](int64_t rows, int64_t b, int group) {
        with_x_rows(rows, [&](auto G) {
          finish_block_avx512<R, decltype(G)::value>(w, x + b, n, state[group], sums + b, batch);
        });
      });
}

// R weight rows against all `batch` rows of x. Up to two rows of x, the halves together
// (at most 24 accumulators), every weight row read as one stream; from three on, the
// halves apart, kBlockXRows rows of x at a time, each group fetching its share of the next
// block. Measured with the random 12 x 768 model in float32 on a 2-core Xeon, tokens/s:
// batch 1 47-48 (41-44 with dot_avx2 a row at a time), batch 2 86-89 (three rows
// together: 81, and 75-76 without the prefetch), batch 4 148-150 (three rows together: 137-139).
template <int R, typename W>
void weight_rows_avx512(const W* const* w, const float* const* x, int64_t batch, int64_t n, float* sums) {
  static_assert(kBlockXRows == 4, "the remainder's cases below");
  if (batch <= 2) {
    if (batch == 2)
      dot_block_avx512<R, 2, true>(w, x, n, sums, batch, 0, 1);
    else
      dot_block_avx512<R, 1, true>(w, x, n, sums, batch, 0, 1);
    return;
  }
  const bool wide = (R + kBlockXRows) * n * int64_t(sizeof(W)) > kL1BlockBytes && n / 32 * 32 > kChunkColumns;
  if (batch > kBlockXRows && wide) return weight_rows_avx512_chunked<R>(w, x, batch, n, sums);
  const int parts = int((batch + kBlockXRows - 1) / kBlockXRows);
  int64_t b = 0;
  for (; b + kBlockXRows <= batch; b += kBlockXRows)
    dot_block_avx512<R, kBlockXRows, false>(w, x + b, n, sums + b, batch, int(b / kBlockXRows), parts);
  const int part = int(b / kBlockXRows);
  switch (batch - b) {
    case 3: dot_block_avx512<R, 3, false>(w, x + b, n, sums + b, batch, part, parts); break;
    case 2: dot_block_avx512<R, 2, false>(w, x + b, n, sums + b, batch, part, parts); break;
    case 1: dot_block_avx512<R, 1, false>(w, x + b, n, sums + b, batch, part, parts); break;
    default: break;
  }
}

// ---- bfloat16 weights times bfloat16 rows ----
// A bfloat16 model's decode rows are bfloat16 too, and the product of two bfloat16 values
// (8-bit significands) is exact in float32, so the sum can be taken in the order of the
// AVX512-BF16 dot product (vdpbf16ps), which does two such multiply-adds per float32 lane
// in one instruction, on half the bytes, with no widening.
// Every bfloat16 kernel below follows that order, so all of them give the same bits:
// sixteen lane sums; lane j takes, from each 32-element chunk (elements 32c .. 32c+31),
// the product of elements 32c+2j+1 and then that of 32c+2j, each added with one rounding
// (Intel's definition of vdpbf16ps, and bit for bit what Zen 4 computes, checked on 3.2
// million random lanes); a last partial chunk is zero-padded; then lane j and j+8 are
// added, then j and j+4, j and j+2, and lanes 0 and 1. vdpbf16ps also flushes denormal
// inputs and results to zero, the emulations do not: their bits can differ only where a
// product or a partial sum is below 2^-126 in magnitude.
constexpr int kBf16Chunk = 32, kBf16Lanes = 16;

// `count` rows a fixed stride apart (a block of weight rows, a batch's rows of x): row k
// at first + k * stride. An array of row pointers cost the bfloat16 kernels a fifth of
// their rate: GCC kept the pointers in vector registers and took them out one by one at
// every step (1B shape, bfloat16, batch 32, 2 threads: 86 -> 105 tokens/s).
template <typename T>
struct Rows {
  const T* first;
  int64_t stride;
  const T* operator[](int64_t k) const { return first + k * stride; }
  Rows operator+(int64_t k) const { return {first + k * stride, stride}; }
};

// The order above in scalar code: any CPU, and the tests' reference.
float dot_bf16_portable(const uint16_t* w, const uint16_t* x, int64_t n) {
  float lane[kBf16Lanes] = {};
  for (int64_t c = 0; c < n; c += kBf16Chunk)
    for (int j = 0; j < kBf16Lanes; ++j)
      for (int k : {2 * j + 1, 2 * j}) {
        const int64_t e = c + k;
        lane[j] += e < n ? widen(w[e]) * widen(x[e]) : 0.0f;  // exact product, one rounding; padding adds +0
      }
  float s8[8], s4[4];
  for (int j = 0; j < 8; ++j) s8[j] = lane[j] + lane[j + 8];
  for (int j = 0; j < 4; ++j) s4[j] = s8[j] + s8[j + 4];
  return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

#ifdef KVEVICT_MATVEC_AVX2
// Lanes 0..7 and 8..15 folded as above; the same sequence as the float32 kernels' final sum.
__attribute__((target("avx2,fma"), always_inline)) inline float sum_lanes(__m256 low, __m256 high) {
  const __m256 s8 = _mm256_add_ps(low, high);
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_shuffle_ps(h, h, 1));
  return _mm_cvtss_f32(h);
}

// The zero-padded copy of a row's last partial chunk (n % 32 elements, then zeros).
inline void padded_tail(const uint16_t* row, int64_t n, uint16_t (&chunk)[kBf16Chunk]) {
  const int64_t from = n / kBf16Chunk * kBf16Chunk;
  for (int64_t k = 0; k < kBf16Chunk; ++k) chunk[k] = from + k < n ? row[from + k] : uint16_t{0};
}

// R weight rows x G rows of x; sums[r * stride + g]. Each kernel's chunk step is applied to
// every whole chunk and then, if n is not a multiple of 32, to the zero-padded last one.
// vdpbf16ps itself: one instruction per chunk and (weight row, x row).
struct Bf16Dot {
  using X = uint16_t;  // rows of x as they come
  static constexpr int kWeightRows = 6;  // 24 accumulators, six weight chunks and one x chunk of the 32 registers
  // The chunk at column i of R weight rows x G rows of x.
  template <int R, int G>
  __attribute__((target("avx512f,avx512bf16"), always_inline)) static inline void step(__m512 (&acc)[R][G],
                                                                                      Rows<uint16_t> w,
                                                                                      Rows<uint16_t> x, int64_t i) {
    // Both operands in registers: Zen 4 streams a weight row at about half the rate when
    // the load is folded into vdpbf16ps as its memory operand (one row, one thread:
    // 12.5 against 22.7 GB/s).
    __m512i wv[R];
    for (int r = 0; r < R; ++r) {
      wv[r] = _mm512_loadu_si512(w[r] + i);
      asm("" : "+v"(wv[r]));
    }
    for (int g = 0; g < G; ++g) {
      __m512i xv = _mm512_loadu_si512(x[g] + i);
      asm("" : "+v"(xv));
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_dpbf16_ps(acc[r][g], (__m512bh)wv[r], (__m512bh)xv);
    }
  }
  // Whole chunks [from, to) of R weight rows x G rows of x, the accumulators carried in
  // `acc` (started at zero when `first`); `share` fetches its part of the next block.
  static constexpr bool kColumnChunks = true;
  template <int R, int G, int GS>
  __attribute__((target("avx512f,avx512bf16,avx2,fma"))) static void columns(Rows<uint16_t> w, Rows<uint16_t> x,
                                                                            int64_t from, int64_t to, bool first,
                                                                            __m512 (&state)[R][GS],
                                                                            PrefetchShare& share) {
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = first ? _mm512_setzero_ps() : state[r][g];
    for (int64_t i = from; i < to; i += kBf16Chunk) {
      share.step(w[R - 1] + i);
      step<R, G>(acc, w, x, i);
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) state[r][g] = acc[r][g];
  }
  // The zero-padded last chunk, then each pair's lane sums: sums[r * stride + g].
  template <int R, int G, int GS>
  __attribute__((target("avx512f,avx512bf16,avx2,fma"))) static void finish(Rows<uint16_t> w, Rows<uint16_t> x,
                                                                           int64_t n, __m512 (&state)[R][GS],
                                                                           float* sums, int64_t stride) {
    __m512 acc[R][G];
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = state[r][g];
    if (n % kBf16Chunk != 0) {
      uint16_t wt[R][kBf16Chunk], xt[G][kBf16Chunk];
      for (int r = 0; r < R; ++r) padded_tail(w[r], n, wt[r]);
      for (int g = 0; g < G; ++g) padded_tail(x[g], n, xt[g]);
      step<R, G>(acc, Rows<uint16_t>{wt[0], kBf16Chunk}, Rows<uint16_t>{xt[0], kBf16Chunk}, 0);
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g)
        sums[r * stride + g] = sum_lanes(_mm512_castps512_ps256(acc[r][g]), upper_half(acc[r][g]));
  }
  template <int R, int G>
  __attribute__((target("avx512f,avx512bf16,avx2,fma"))) static void block(Rows<uint16_t> w, Rows<uint16_t> x,
                                                                          int64_t n, float* sums, int64_t stride,
                                                                          int prefetch_part, int prefetch_parts) {
    __m512 acc[R][G];  // [weight row][x row]
    const int64_t whole = n / kBf16Chunk * kBf16Chunk;
    PrefetchShare share(w[R - 1] + n, R * n * 2, prefetch_part, prefetch_parts, whole / kBf16Chunk);
    columns<R, G>(w, x, 0, whole, true, acc, share);
    finish<R, G>(w, x, n, acc, sums, stride);
  }
};

// A 32-element bfloat16 chunk's pairs as float32: each 32-bit lane j holds elements 2j (low
// half) and 2j+1 (high half); masking gives the odd one, a shift the even one (exact).
__attribute__((target("avx512f"), always_inline)) inline void split_pairs(__m512i chunk, __m512& odd, __m512& even) {
  odd = _mm512_castsi512_ps(_mm512_and_si512(chunk, _mm512_set1_epi32(int(0xFFFF0000u))));
  even = _mm512_castsi512_ps(_mm512_slli_epi32(chunk, 16));
}

// The same sums in AVX-512F: each weight chunk split into its odd and even elements
// (split_pairs), and two FMAs add their exact products as vdpbf16ps does. x comes widened once per product
// (widen_pairs), so a chunk step widens only its R weight chunks. Where the CPU runs two
// FMAs faster than one vdpbf16ps (the Xeon here: 32 against 16 multiply-adds a cycle,
// measured), this kernel outruns Bf16Dot at every batch: 1B shape, bfloat16, batch 32, 2
// threads, 76 -> 105 tokens/s.
struct Bf16Fma {
  using X = float;  // rows of x from widen_pairs
  static constexpr int kWeightRows = 5;  // 20 accumulators, 10 widened weight chunks, x and the mask: 32 registers
  static constexpr bool kColumnChunks = false;
  // The chunk at column i of R weight rows x G rows of x (x's chunk at float i: its odd
  // elements, then its even ones).
  template <int R, int G>
  __attribute__((target("avx512f"), always_inline)) static inline void step(__m512 (&acc)[R][G], Rows<uint16_t> w,
                                                                              Rows<float> x, int64_t i) {
    __m512 w_odd[R], w_even[R];
    for (int r = 0; r < R; ++r) {
      __m512i v = _mm512_loadu_si512(w[r] + i);
      asm("" : "+v"(v));  // one load, not one for each of the two widenings
      split_pairs(v, w_odd[r], w_even[r]);
    }
    for (int g = 0; g < G; ++g) {
      __m512 x_odd = _mm512_loadu_ps(x[g] + i);
      asm("" : "+v"(x_odd));  // kept in a register for its R products
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(w_odd[r], x_odd, acc[r][g]);
      __m512 x_even = _mm512_loadu_ps(x[g] + i + kBf16Lanes);
      asm("" : "+v"(x_even));
      for (int r = 0; r < R; ++r) acc[r][g] = _mm512_fmadd_ps(w_even[r], x_even, acc[r][g]);
    }
  }
  template <int R, int G>
  __attribute__((target("avx512f,avx2,fma"))) static void block(Rows<uint16_t> w, Rows<float> x, int64_t n,
                                                               float* sums, int64_t stride, int prefetch_part,
                                                               int prefetch_parts) {
    __m512 acc[R][G];  // [weight row][x row]
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) acc[r][g] = _mm512_setzero_ps();
    const int64_t whole = n / kBf16Chunk * kBf16Chunk;
    PrefetchShare share(w[R - 1] + n, R * n * 2, prefetch_part, prefetch_parts, whole / kBf16Chunk);
    for (int64_t i = 0; i < whole; i += kBf16Chunk) {
      share.step(w[R - 1] + i);
      step<R, G>(acc, w, x, i);
    }
    if (whole < n) {  // x's padded chunk is in place; the weights' is copied
      uint16_t wt[R][kBf16Chunk];
      for (int r = 0; r < R; ++r) padded_tail(w[r], n, wt[r]);
      step<R, G>(acc, Rows<uint16_t>{wt[0], kBf16Chunk}, Rows<float>{x[0] + whole, x.stride}, 0);
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g)
        sums[r * stride + g] = sum_lanes(_mm512_castps512_ps256(acc[r][g]), upper_half(acc[r][g]));
  }
};

// x's rows for Bf16Fma: each 32-element chunk (the last one zero-padded) as 32 floats,
// its odd elements 1, 3, .. 31 and then its even ones 0, 2, .. 30 (the two operands of a
// chunk's two FMAs). Lines of 64 bytes: a vector load across two cache lines costs two.
struct alignas(64) FloatLine {
  float f[kBf16Lanes];
};
struct WidenedRows {
  std::vector<FloatLine> lines;  // [batch][chunk][odd, even]
  int64_t stride;                // floats per row
  Rows<float> rows() const { return {lines.front().f, stride}; }
};
__attribute__((target("avx512f"))) WidenedRows widen_pairs(const uint16_t* x, int64_t batch, int64_t in) {
  const int64_t chunks = (in + kBf16Chunk - 1) / kBf16Chunk;
  WidenedRows wide{std::vector<FloatLine>(static_cast<size_t>(batch * chunks * 2)), chunks * kBf16Chunk};
  for (int64_t b = 0; b < batch; ++b) {
    const uint16_t* row = x + b * in;
    for (int64_t c = 0; c < chunks; ++c) {
      uint16_t padded[kBf16Chunk];
      const bool last_partial = (c + 1) * kBf16Chunk > in;
      if (last_partial) padded_tail(row, in, padded);
      __m512 odd, even;
      split_pairs(_mm512_loadu_si512(last_partial ? padded : row + c * kBf16Chunk), odd, even);
      FloatLine* to = &wide.lines[static_cast<size_t>((b * chunks + c) * 2)];
      _mm512_store_ps(to[0].f, odd);
      _mm512_store_ps(to[1].f, even);
    }
  }
  return wide;
}

// And in AVX2: lanes 0..7 (the first 16 elements of each chunk) over the whole row, then
// lanes 8..15, so the accumulators of one half fit its 16 registers.
struct Bf16Avx2 {
  using X = uint16_t;
  static constexpr int kWeightRows = 2;  // per half: 8 accumulators, 4 weight halves, 2 x halves
  static constexpr bool kColumnChunks = false;
  // Lanes 0..7 (half 0) or 8..15 (half 1) of the chunk at column i.
  template <int R, int G>
  __attribute__((target("avx2,fma"), always_inline)) static inline void step(__m256 (&acc)[R][G], int half,
                                                                             Rows<uint16_t> w, Rows<uint16_t> x,
                                                                             int64_t i) {
    const __m256i high_half = _mm256_set1_epi32(int(0xFFFF0000u));
    __m256 w_odd[R], w_even[R];
    for (int r = 0; r < R; ++r) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[r] + i + 16 * half));
      w_odd[r] = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
      w_even[r] = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
    }
    for (int g = 0; g < G; ++g) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x[g] + i + 16 * half));
      const __m256 x_odd = _mm256_castsi256_ps(_mm256_and_si256(v, high_half));
      const __m256 x_even = _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
      for (int r = 0; r < R; ++r) {
        acc[r][g] = _mm256_fmadd_ps(w_odd[r], x_odd, acc[r][g]);
        acc[r][g] = _mm256_fmadd_ps(w_even[r], x_even, acc[r][g]);
      }
    }
  }
  template <int R, int G>
  __attribute__((target("avx2,fma"))) static void block(Rows<uint16_t> w, Rows<uint16_t> x, int64_t n, float* sums,
                                                       int64_t stride, int prefetch_part, int prefetch_parts) {
    const int64_t whole = n / kBf16Chunk * kBf16Chunk;
    PrefetchShare share(w[R - 1] + n, R * n * 2, prefetch_part, prefetch_parts, 2 * (whole / kBf16Chunk));
    uint16_t wt[R][kBf16Chunk], xt[G][kBf16Chunk];
    if (whole < n) {
      for (int r = 0; r < R; ++r) padded_tail(w[r], n, wt[r]);
      for (int g = 0; g < G; ++g) padded_tail(x[g], n, xt[g]);
    }
    __m256 lanes[2][R][G];  // [half][weight row][x row]
    for (int half = 0; half < 2; ++half) {
      __m256 acc[R][G];
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) acc[r][g] = _mm256_setzero_ps();
      for (int64_t i = 0; i < whole; i += kBf16Chunk) {
        share.step(w[R - 1] + i);
        step<R, G>(acc, half, w, x, i);
      }
      if (whole < n) step<R, G>(acc, half, Rows<uint16_t>{wt[0], kBf16Chunk}, Rows<uint16_t>{xt[0], kBf16Chunk}, 0);
      for (int r = 0; r < R; ++r)
        for (int g = 0; g < G; ++g) lanes[half][r][g] = acc[r][g];
    }
    for (int r = 0; r < R; ++r)
      for (int g = 0; g < G; ++g) sums[r * stride + g] = sum_lanes(lanes[0][r][g], lanes[1][r][g]);
  }
};

// The column chunks of weight_rows_avx512_chunked, for a bfloat16 kernel that has them.
template <class Kernel, int R>
void bf16_weight_rows_chunked(Rows<uint16_t> w, Rows<typename Kernel::X> x, int64_t batch, int64_t n, float* sums) {
  __m512 state[kChunkXRows / kBlockXRows][R][kBlockXRows];  // [x group][weight row][x row]
  for_column_chunks(
      batch, n / kBf16Chunk * kBf16Chunk,
      [&](int64_t rows, int64_t b, int group, int64_t from, int64_t to, bool first, int part, int parts) {
        PrefetchShare share(w[R - 1] + n, R * n * 2, part, parts, (to - from) / kBf16Chunk);
        with_x_rows(rows, [&](auto G) {
          Kernel::template columns<R, decltype(G)::value>(w, x + b, from, to, first, state[group], share);
        });
      },
      [&](int64_t rows, int64_t b, int group) {
        with_x_rows(rows, [&](auto G) {
          Kernel::template finish<R, decltype(G)::value>(w, x + b, n, state[group], sums + b, batch);
        });
      });
}

// R weight rows against all `batch` rows of x, four at a time.
template <class Kernel, int R>
void bf16_weight_rows(Rows<uint16_t> w, Rows<typename Kernel::X> x, int64_t batch, int64_t n, float* sums,
                      bool fetch_next_block) {
  if constexpr (Kernel::kColumnChunks)
    if (batch > 4 && (R + 4) * n * 2 > kL1BlockBytes && n / kBf16Chunk * kBf16Chunk > kChunkColumns)
      return bf16_weight_rows_chunked<Kernel, R>(w, x, batch, n, sums);
  const int parts = fetch_next_block ? int((batch + 3) / 4) : 0;  // 0: stream ahead (PrefetchShare)
  int64_t b = 0;
  for (; b + 4 <= batch; b += 4) Kernel::template block<R, 4>(w, x + b, n, sums + b, batch, int(b / 4), parts);
  const int part = int(b / 4);
  switch (batch - b) {
    case 3: Kernel::template block<R, 3>(w, x + b, n, sums + b, batch, part, parts); break;
    case 2: Kernel::template block<R, 2>(w, x + b, n, sums + b, batch, part, parts); break;
    case 1: Kernel::template block<R, 1>(w, x + b, n, sums + b, batch, part, parts); break;
    default: break;
  }
}

// Weight rows r .. r+count-1 (count <= Kernel::kWeightRows) against x's rows:
// sums[k * batch + b]. Fewer than 4 rows of x are bound by reading the weights, which
// stream best one row at a time with the line 16 KiB ahead fetched at each step
// (PrefetchShare's parts = 0; six rows with the next block fetched into L2 gave the
// batch-1 step of the random 12 x 768 model in bfloat16 71 tokens/s against llama.cpp's
// 133, in one run).
template <class Kernel>
void bf16_block_rows(const uint16_t* w, int64_t r, int64_t count, Rows<typename Kernel::X> x, int64_t batch,
                     int64_t n, float* sums) {
  const Rows<uint16_t> block{w + r * n, n};
  const bool fetch_next_block = batch >= 4;
  switch (count) {
    case 6: if constexpr (Kernel::kWeightRows >= 6) bf16_weight_rows<Kernel, 6>(block, x, batch, n, sums, fetch_next_block); break;
    case 5: if constexpr (Kernel::kWeightRows >= 5) bf16_weight_rows<Kernel, 5>(block, x, batch, n, sums, fetch_next_block); break;
    case 4: if constexpr (Kernel::kWeightRows >= 4) bf16_weight_rows<Kernel, 4>(block, x, batch, n, sums, fetch_next_block); break;
    case 3: if constexpr (Kernel::kWeightRows >= 3) bf16_weight_rows<Kernel, 3>(block, x, batch, n, sums, fetch_next_block); break;
    case 2: bf16_weight_rows<Kernel, 2>(block, x, batch, n, sums, fetch_next_block); break;
    case 1: bf16_weight_rows<Kernel, 1>(block, x, batch, n, sums, fetch_next_block); break;
    default: throw Error("matvec: a bfloat16 block of " + std::to_string(count) + " weight rows");
  }
}
#endif

std::atomic<MatvecIsa> widest_allowed{MatvecIsa::Avx512Bf16};
std::atomic<bool> bf16_dot_preferred{false};

// ATen's own switch lowers this kernel too, so that an AVX-512 machine runs the AVX2 path.
MatvecIsa isa_from_environment() {
  const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
  const std::string named = capability ? capability : "";
  if (named == "default") return MatvecIsa::Portable;
  if (named == "avx2") return MatvecIsa::Avx2;
  return MatvecIsa::Avx512Bf16;
}

bool cpu_has_avx512() {
  static const bool has = __builtin_cpu_supports("avx512f") && isa_from_environment() >= MatvecIsa::Avx512;
  return has;
}

bool cpu_has_avx512_bf16() {
  static const bool has = cpu_has_avx512() && __builtin_cpu_supports("avx512bf16");
  return has;
}

bool cpu_has_avx2_fma() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                          isa_from_environment() >= MatvecIsa::Avx2;
  return has;
}

MatvecIsa widest() { return widest_allowed.load(std::memory_order_relaxed); }
bool use_avx512() { return cpu_has_avx512() && widest() >= MatvecIsa::Avx512; }
bool use_bf16_dot() {
  return cpu_has_avx512_bf16() && widest() >= MatvecIsa::Avx512Bf16 &&
         (bf16_dot_preferred.load(std::memory_order_relaxed) || bf16_dot_outruns_fma());
}
bool use_avx2() { return cpu_has_avx2_fma() && widest() >= MatvecIsa::Avx2; }
#endif

template <typename W>
float dot(const W* w, const float* x, int64_t n) {
#ifdef KVEVICT_MATVEC_AVX2
  if (use_avx2()) return dot_avx2(w, x, n);
#endif
  return dot_portable(w, x, n);
}

inline void store(float* y, float value) { *y = value; }
inline void store(c10::BFloat16* y, float value) { *y = c10::BFloat16(value); }  // round to nearest even

// The B sums of one weight row against x's B rows (x[b] is row b), each with dot()'s bits.
template <typename W>
void dot_rows(const W* w, const float* const* x, int64_t batch, int64_t n, float* sums) {
#ifdef KVEVICT_MATVEC_AVX2
  if (use_avx2()) {
    int64_t b = 0;
    for (; b + 3 <= batch; b += 3) dot_rows_avx2<3>(w, x + b, n, sums + b);
    if (batch - b == 2) dot_rows_avx2<2>(w, x + b, n, sums + b);
    if (batch - b == 1) sums[b] = dot_avx2(w, x[b], n);
    return;
  }
#endif
  for (int64_t b = 0; b < batch; ++b) sums[b] = dot_portable(w, x[b], n);
}

// The sums of weight rows r .. r+count-1 against x's rows, each with dot()'s bits:
// sums[k * batch + b] for weight row r+k and x row b.
template <typename W>
void dot_weight_rows(const W* w, int64_t r, int64_t count, const float* const* x, int64_t batch, int64_t n,
                     float* sums) {
#ifdef KVEVICT_MATVEC_AVX2
  const W* block[kAvx512WeightRows];  // weight rows r .. r+count-1, count <= weight_rows_per_block()
  for (int k = 0; k < count; ++k) block[k] = w + (r + k) * n;
  if (use_avx512()) {
    static_assert(kAvx512WeightRows == 6, "the cases below");
    switch (count) {
      case 6: weight_rows_avx512<6>(block, x, batch, n, sums); return;
      case 5: weight_rows_avx512<5>(block, x, batch, n, sums); return;
      case 4: weight_rows_avx512<4>(block, x, batch, n, sums); return;
      case 3: weight_rows_avx512<3>(block, x, batch, n, sums); return;
      case 2: weight_rows_avx512<2>(block, x, batch, n, sums); return;
      case 1: weight_rows_avx512<1>(block, x, batch, n, sums); return;
      default: break;
    }
  }
  if (use_avx2() && count == kBlockWeightRows && batch >= kBlockXRows) {
    int64_t b = 0;
    const int parts = int(batch / kBlockXRows);
    for (; b + kBlockXRows <= batch; b += kBlockXRows)
      dot_block_avx2<kBlockWeightRows, kBlockXRows>(block, x + b, n, sums + b, batch, int(b / kBlockXRows), parts);
    if (b < batch)
      for (int k = 0; k < kBlockWeightRows; ++k) dot_rows(block[k], x + b, batch - b, n, sums + k * batch + b);
    return;
  }
#endif
  for (int64_t k = 0; k < count; ++k) dot_rows(w + (r + k) * n, x, batch, n, sums + k * batch);
}

// Weight rows per call of dot_weight_rows: the AVX-512 block's six at every batch size
// (kAvx512WeightRows), otherwise three, as the AVX2 block.
int weight_rows_per_block() {
#ifdef KVEVICT_MATVEC_AVX2
  if (use_avx512()) return kAvx512WeightRows;
#endif
  return kBlockWeightRows;
}

// One product of a group that shares x: weight [out, in], bias [out] or null, y [batch, out].
template <typename W, typename Out>
struct Product {
  const W* weight;
  const W* bias;
  Out* y;
  int64_t out;
};

// Every block of `block_rows` weight rows of every product through
// block(weight, r, count, sums) (sums[k * batch + b]: weight row r+k, x row b), each sum
// plus its bias stored into y. One parallel region serves the whole group, and the
// threads take blocks as they come for them, a shrinking share of what is left (OpenMP's
// guided schedule): halves fixed in advance left the first thread waiting for the second,
// which wakes later, at the end of every product (float32 batch 1 of the random
// 12 x 768 model on 2 threads: 4.6% of the first thread's samples in libgomp). Which
// thread computes an output changes none of its bits.
template <typename W, typename Out, class Block>
void for_weight_blocks(const std::vector<Product<W, Out>>& products, int64_t batch, int64_t in, int64_t block_rows,
                       Block&& block) {
  std::vector<int64_t> first_block{0};  // [products + 1]: each product's first block in the group
  int64_t weight_rows = 0;
  for (const auto& p : products) {
    first_block.push_back(first_block.back() + (p.out + block_rows - 1) / block_rows);
    weight_rows += p.out;
  }
  const int64_t blocks = first_block.back();
  // A thread for each 128 KiB of weights at most: a smaller share costs more to hand to
  // a thread than it takes to read (a tiny model's products stay on one thread).
  const int64_t weight_bytes = weight_rows * in * int64_t(sizeof(W));
  const int64_t threads = std::clamp<int64_t>(weight_bytes >> 17, 1, at::get_num_threads());
  std::atomic<int64_t> next_block{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    std::vector<float> sums(static_cast<size_t>(block_rows * batch));  // [weight rows][batch]
    size_t p = 0;  // the product of block i: a thread's claims only ever move forward
    int64_t begin = next_block.load(std::memory_order_relaxed), take = 0;
    for (;;) {
      do {
        if (begin >= blocks) return;
        take = std::max<int64_t>(1, (blocks - begin) / (2 * threads));
      } while (!next_block.compare_exchange_weak(begin, begin + take, std::memory_order_relaxed));
      for (int64_t i = begin; i < begin + take; ++i) {
        while (i >= first_block[p + 1]) ++p;
        const Product<W, Out>& product = products[p];
        const int64_t r = (i - first_block[p]) * block_rows;
        const int64_t count = std::min(block_rows, product.out - r);
        block(product.weight, r, count, sums.data());
        for (int64_t b = 0; b < batch; ++b) {  // each row of y written in one run of `count` outputs
          Out* y = product.y + b * product.out + r;
          for (int64_t k = 0; k < count; ++k) {
            float sum = sums[k * batch + b];
            if (product.bias) sum += widen(product.bias[r + k]);
            store(y + k, sum);
          }
        }
      }
      begin = next_block.load(std::memory_order_relaxed);
    }
  });
}

// float32 weights times `batch` float32 rows of x (`in` floats each).
void rows_f32(const std::vector<Product<float, float>>& products, const float* x, int64_t batch, int64_t in) {
  std::vector<const float*> x_rows(static_cast<size_t>(batch));  // [batch]: row b of x
  for (int64_t b = 0; b < batch; ++b) x_rows[b] = x + b * in;
  for_weight_blocks(products, batch, in, weight_rows_per_block(),
                    [&](const float* w, int64_t r, int64_t count, float* sums) {
                      dot_weight_rows(w, r, count, x_rows.data(), batch, in, sums);
                    });
}

// Every block of every product by one bfloat16 kernel, x's rows as that kernel reads them.
template <class Kernel, typename X>
void bf16_products(const std::vector<Product<uint16_t, c10::BFloat16>>& products, Rows<X> x, int64_t batch,
                   int64_t in) {
  const int64_t weight_rows = batch < 4 ? 1 : Kernel::kWeightRows;  // see bf16_block_rows
  for_weight_blocks(products, batch, in, weight_rows, [&](const uint16_t* w, int64_t r, int64_t count, float* sums) {
    bf16_block_rows<Kernel>(w, r, count, x, batch, in, sums);
  });
}

// bfloat16 weights times `batch` bfloat16 rows of x; each weight row is read once for all
// rows of x, by the widest kernel of the order above.
void rows_bf16(const std::vector<Product<uint16_t, c10::BFloat16>>& products, const uint16_t* x, int64_t batch,
               int64_t in) {
  const Rows<uint16_t> x_rows{x, in};
#ifdef KVEVICT_MATVEC_AVX2
  if (use_bf16_dot()) return bf16_products<Bf16Dot>(products, x_rows, batch, in);
  if (use_avx512()) {
    const WidenedRows wide = widen_pairs(x, batch, in);
    return bf16_products<Bf16Fma>(products, wide.rows(), batch, in);
  }
  if (use_avx2()) return bf16_products<Bf16Avx2>(products, x_rows, batch, in);
#endif
  for_weight_blocks(products, batch, in, 1, [&](const uint16_t* w, int64_t r, int64_t, float* sums) {
    for (int64_t b = 0; b < batch; ++b) sums[b] = dot_bf16_portable(w + r * in, x_rows[b], in);
  });
}

}  // namespace

MatvecIsa matvec_isa() {
#ifdef KVEVICT_MATVEC_AVX2
  if (use_bf16_dot()) return MatvecIsa::Avx512Bf16;
  if (use_avx512()) return MatvecIsa::Avx512;
  if (use_avx2()) return MatvecIsa::Avx2;
#endif
  return MatvecIsa::Portable;
}

void prefer_bf16_dot(bool prefer) {
#ifdef KVEVICT_MATVEC_AVX2
  bf16_dot_preferred.store(prefer, std::memory_order_relaxed);
#else
  (void)prefer;
#endif
}

void limit_matvec_isa(MatvecIsa widest) {
#ifdef KVEVICT_MATVEC_AVX2
  widest_allowed.store(widest, std::memory_order_relaxed);
#else
  (void)widest;
#endif
}

bool matvec_supported(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias) {
  const auto type = weight.scalar_type();
  if (!weight.device().is_cpu() || !x.device().is_cpu() || weight.dim() != 2) return false;
  if (x.dim() != 1 && !(x.dim() == 2 && x.size(0) >= 1)) return false;
  if ((type != torch::kFloat32 && type != torch::kBFloat16) || x.scalar_type() != type) return false;
  if (!weight.is_contiguous() || x.size(-1) != weight.size(1)) return false;
  if (bias.defined() &&
      (bias.scalar_type() != type || bias.dim() != 1 || bias.size(0) != weight.size(0) || !bias.is_contiguous() ||
       !bias.device().is_cpu()))
    return false;
  return true;
}

std::vector<torch::Tensor> matvec_each(const std::vector<Linear>& linears, const torch::Tensor& x) {
  for (const Linear& l : linears)
    if (!matvec_supported(l.weight, x, l.bias))  // each weight of x's dtype and width
      throw Error(std::string("matvec: weight ") + c10::toString(l.weight.scalar_type()) + " [" +
                  std::to_string(l.weight.size(0)) + ", " + std::to_string(l.weight.dim() > 1 ? l.weight.size(1) : 0) +
                  "] with x " + c10::toString(x.scalar_type()) + " of " + std::to_string(x.numel()) +
                  " elements is not a case matvec_supported() accepts");
  std::vector<torch::Tensor> ys;  // [linears]: each [batch, out] or [out]
  if (linears.empty()) return ys;
  const int64_t in = x.size(-1), batch = x.dim() == 2 ? x.size(0) : 1;
  const torch::Tensor xc = x.contiguous();
  for (const Linear& l : linears)
    ys.push_back(x.dim() == 2 ? torch::empty({batch, l.weight.size(0)}, l.weight.options())
                              : torch::empty({l.weight.size(0)}, l.weight.options()));
  if (xc.scalar_type() == torch::kFloat32) {
    std::vector<Product<float, float>> products;
    for (size_t i = 0; i < linears.size(); ++i) {
      const Linear& l = linears[i];
      products.push_back({l.weight.data_ptr<float>(), l.bias.defined() ? l.bias.data_ptr<float>() : nullptr,
                          ys[i].data_ptr<float>(), l.weight.size(0)});
    }
    rows_f32(products, xc.data_ptr<float>(), batch, in);
  } else {
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); };
    std::vector<Product<uint16_t, c10::BFloat16>> products;
    for (size_t i = 0; i < linears.size(); ++i) {
      const Linear& l = linears[i];
      products.push_back({bits(l.weight), l.bias.defined() ? bits(l.bias) : nullptr, ys[i].data_ptr<at::BFloat16>(),
                          l.weight.size(0)});
    }
    rows_bf16(products, bits(xc), batch, in);
  }
  return ys;
}

torch::Tensor matvec(const torch::Tensor& weight, const torch::Tensor& x, const torch::Tensor& bias) {
  return matvec_each({Linear{weight, bias}}, x).front();
}

}  // namespace kvevict
