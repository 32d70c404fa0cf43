"""C++ source of the kernels' matrix product on a packed weight layout: bfloat16 on Intel AMX tiles or with
AVX512-BF16 dot products (AMD Zen 4 and later), float32 with AVX-512 FMAs; built with the fused CPU kernels
(`cpu_fused` puts it before `cpu_fused_source.SOURCE`, whose `linear` and `swiglu` call it).

A decode step multiplies a few dozen rows by every weight, so it is bound by reading the weights
from memory. On 2 cores of a Xeon with AMX, oneDNN's bfloat16 product reads SmolLM2's weights at
7-19 GB/s at 1-32 rows; this one streams them at 17-34 GB/s (1.5-2.3x oneDNN; about equal from 64
rows up; `benchmarks/cpu_products.py` then read 8 weights a shape, which that host's 300 MiB L3 held)
because its weight is laid out in exactly the order its tiles read it. On an AMD Zen 5, weights from
memory, SmolLM2's layer products run 0.95-2.0x oneDNN's at 1-64 rows with the bfloat16 dot products
(1.3-2.0x at 32), 1.05-1.6x with the float32 FMAs (docs/perf.md).

**Layout** (`models.linear.pack`): for each block of 32 output columns, a run of 2 KiB steps along K, each
two 1 KiB halves (columns 0-15, 16-31) of 16 rows of 64 bytes. In bfloat16 ([N/32, K/32, 2, 16, 16, 2]) a
step covers 32 values of K and is two B tiles in the VNNI form `TDPBF16PS` reads: row p holds, for each of
its 16 columns, the weights at k = 2p and 2p + 1. In float32 ([N/32, K/16, 2, 16, 16]) a step covers 16
values of K, row p the weights at k = p. A block's steps follow one another, so a thread reads its columns'
weights as one sequential stream, prefetched into L2 `kPrefetchL2` steps ahead and into L1 `kPrefetchL1`
steps ahead; with dot products, the passes over a block also fetch the next block into L2 (`Share`).

**Product**: each thread takes whole 32-column blocks; for each block it walks 32 rows of x at a time.
On AMX tiles (`tile_block_product`): two A tiles of 16 rows, four 16 x 16 float32 accumulators in tiles
over all of K; rows of x past the last whole 16 are read from a zero-padded copy. With dot products
(`dot_block_product`): passes of up to 12 rows, each row's 32 outputs in two 16-lane accumulators, and
for each 4-byte word of the row (a pair of bfloat16 values, or one float) the word broadcast against the
tile row it multiplies (`VDPBF16PS`, or `VFMADD231PS`): the layout's rows are exactly that operand. The
float32 sums are then rounded to bfloat16 (to nearest even, as oneDNN and ATen round) or kept. Either
way an output's sum runs in an order fixed by K alone, whatever rows share the product (batch
invariance, `cpu_fused`), and in another order than ATen's, so results match `F.linear` to rounding,
not bit for bit.

**Gated product** (`amx::gated_linear`, the SwiGLU MLP's gate-up product for the one-call decoder):
a [gate | up] weight's gate block and its up block are multiplied one after the other, each value as
`linear` gives it, and handed 32 columns at a time to the activation (SiLU x up, from
`cpu_fused_source`), so the result is the activation of `linear`'s output bit for bit without the
[M, 2I] product ever being written out and read back.

Compiled where the compiler targets AVX-512 (`-march=native` on such a CPU), bfloat16 where it targets
AVX512-BF16, the tiles where it targets AMX-BF16 too; a process the OS refuses the tile state multiplies
with dot products. Elsewhere `amx::linear` multiplies the unpacked weight with ATen (the Python side packs
weights only on CPUs that have the product, so that path is a safety net, not a code path).
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <type_traits>
#if defined(__AVX512F__)
#include <immintrin.h>
#define MCPMUX_PACKED_F32 1  // the packed layout has a float32 product here: AVX-512 FMAs
#endif
#if defined(__AVX512BF16__)
#define MCPMUX_PACKED 1  // and a bfloat16 one: AVX512-BF16 dot products, AMX tiles too below
#endif
#if defined(MCPMUX_PACKED) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define MCPMUX_AMX 1
#endif

namespace amx {

// Whether w is a packed weight: bfloat16 [N/32, K/32, 2, 16, 16, 2] or float32 [N/32, K/16, 2, 16, 16].
bool is_packed(const torch::Tensor& w) {
  return !w.is_mkldnn() && ((w.dim() == 6 && w.scalar_type() == torch::kBFloat16) ||
                            (w.dim() == 5 && w.scalar_type() == torch::kFloat32));
}

// The packed weight back as [N, K] (the fallback's operand; the Python side has the same in torch).
torch::Tensor unpacked(const torch::Tensor& w) {
  if (w.dim() == 5) return w.permute({0, 2, 4, 1, 3}).reshape({w.size(0) * 32, w.size(1) * 16});
  return w.permute({0, 2, 4, 1, 3, 5}).reshape({w.size(0) * 32, w.size(1) * 32});
}

#ifdef MCPMUX_PACKED_F32
namespace {

// How far ahead the weights are prefetched, in K steps of 2 KiB: into L1 just before the product reads them,
// and into L2 well before (without the second, a decode step's products took 3-7% longer on AMX, docs/perf.md).
constexpr int64_t kPrefetchL1 = 2, kPrefetchL2 = 8;

// The two element types the layout holds. A K step is 2 KiB of a block's weights either way (32 values of K in
// bfloat16, 16 in float32), in two halves of 1 KiB (columns 0-15, 16-31) of 16 tile rows of 64 bytes; each row of
// x gives a step 16 words of 4 bytes (a pair of bfloat16 values, or one float), word p broadcast against tile row
// p of each half. `Elem`: the dtype of the product's rows, in and out.
struct F32Dot {
  using Elem = float;
  static __m512 madd(__m512 acc, int32_t word, __m512i w) {
    return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_set1_epi32(word)), _mm512_castsi512_ps(w), acc);
  }
};

#ifdef MCPMUX_PACKED
struct Bf16Dot {
  using Elem = c10::BFloat16;
  static __m512 madd(__m512 acc, int32_t word, __m512i w) {
    return _mm512_dpbf16_ps(acc, (__m512bh)_mm512_set1_epi32(word), (__m512bh)w);
  }
};
#endif

// The rows of x a product reads: rows below `whole` in place, the rest (the tiles' last partial 16) from a
// zero-padded copy.
struct Rows {
  const char* xs;
  const char* tail;  // the rows after the last whole 16, zero-padded to 16
  int64_t M, whole, row_bytes, tail_row_bytes;

  const char* at(int64_t r, int64_t& stride_bytes) const {
    if (r < whole) {
      stride_bytes = row_bytes;
      return xs + r * row_bytes;
    }
    stride_bytes = tail_row_bytes;
    return tail;
  }
  const int32_t* words(int64_t r) const { return reinterpret_cast<const int32_t*>(xs + r * row_bytes); }
};

// The 2 KiB of weights `at` steps into the block at wb (`steps` long), running on into `next` (a block as
// long, or nullptr): a step past both is nullptr.
inline const char* weights_at(const char* wb, int64_t steps, const char* next, int64_t at) {
  if (at < steps) return wb + at * 2048;
  if (next == nullptr || at >= 2 * steps) return nullptr;
  return next + (at - steps) * 2048;
}

// Always inlined: a function that only prefetches has no side effects to GCC, which may then drop calls to it.
template <int Hint>
__attribute__((always_inline)) inline void prefetch_step(const char* p) {
  if (p == nullptr) return;
  for (int line = 0; line < 2048; line += 64) _mm_prefetch(p + line, static_cast<_mm_hint>(Hint));
}

// A dot-product pass's share of the next block's weights, fetched into L2 as it multiplies this block: pass
// `part` of `parts` fetches the part-th of the next block's lines, a few with each K step. Only a block's first
// pass reads it from memory, at the pace of its rows' dot products (up to 12: faster than memory feeds two
// cores), and the passes after it read nothing; spread over all of them, the next block streams in at an even,
// lower rate (32-row products from memory 3% faster, docs/perf.md). A product of one pass (12 rows or fewer) has
// nothing to spread it over, and its own prefetches run on into the next block: a share there only fetched it
// twice (decode steps of 1-12 float32 sequences 2-6% slower, docs/perf.md).
struct Share {
  const char* block;  // the next block (as long as this one), or nullptr
  int64_t part, parts;

  __attribute__((always_inline)) inline void fetch(int64_t k, int64_t steps) const {
    if (block == nullptr) return;
    const int64_t step = part * steps + k, lines = 32;  // 32 lines of 64 bytes a step
    for (int64_t line = step * lines / parts; line < (step + 1) * lines / parts; ++line) {
      _mm_prefetch(block + line * 64, _MM_HINT_T1);
    }
  }
};

// Rows r0 .. r0 + R - 1 of x times the 32-column weight block at wb into c (R rows of 32 floats, 32 apart): for
// each word of x in order, broadcast against the tile rows it multiplies for 16 columns each (with AVX512-BF16
// dot products a pair of K at a time, with FMAs one K), so every output is one float32 sum over K in the same
// order whatever the rows beside it. R rows keep 2R accumulators in registers; with `fetch` the weights ahead
// are prefetched as for the tiles.
template <int R, typename Dot>
void dot_rows(const Rows& x, int64_t r0, const char* wb, int64_t steps, bool fetch, const char* next, Share share,
              float* c) {
  __m512 lo[R], hi[R];
  const int32_t* words[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
    words[r] = x.words(r0 + r);
  }
  for (int64_t k = 0; k < steps; ++k) {
    const char* b = wb + k * 2048;
    if (fetch) {
      prefetch_step<_MM_HINT_T0>(weights_at(wb, steps, next, k + kPrefetchL1));
      prefetch_step<_MM_HINT_T1>(weights_at(wb, steps, next, k + kPrefetchL2));
    }
    share.fetch(k, steps);
    for (int p = 0; p < 16; ++p) {
      const __m512i w0 = _mm512_loadu_si512(b + p * 64);
      const __m512i w1 = _mm512_loadu_si512(b + 1024 + p * 64);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const int32_t word = words[r][k * 16 + p];
        lo[r] = Dot::madd(lo[r], word, w0);
        hi[r] = Dot::madd(hi[r], word, w1);
      }
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    _mm512_store_ps(c + r * 32, lo[r]);
    _mm512_store_ps(c + r * 32 + 16, hi[r]);
  }
}

// Rows a dot_rows pass keeps in registers: 24 accumulators, two weight vectors and a broadcast of the 32.
constexpr int kDotRows = 12;
using DotRows = void (*)(const Rows&, int64_t, const char*, int64_t, bool, const char*, Share, float*);
template <typename Dot>
constexpr DotRows kDotPasses[kDotRows] = {&dot_rows<1, Dot>, &dot_rows<2, Dot>,  &dot_rows<3, Dot>,
                                          &dot_rows<4, Dot>, &dot_rows<5, Dot>,  &dot_rows<6, Dot>,
                                          &dot_rows<7, Dot>, &dot_rows<8, Dot>,  &dot_rows<9, Dot>,
                                          &dot_rows<10, Dot>, &dot_rows<11, Dot>, &dot_rows<12, Dot>};

// block_product's contract (below) with dot products: rows m0 .. m0 + 31 in passes of up to kDotRows, the
// first streaming the block's weights from memory (and prefetching ahead), the others reading them from cache
// (taking K a few steps at a time through all the passes measured no faster); where there are several, each
// fetches its share of the next block. The passes split the rows evenly (25 rows as 9, 9 and 7, not 12, 12 and
// 1): a pass of a row or two reads the whole block again for little arithmetic (decode steps of 16 and 25
// float32 sequences 6% and 8% faster, docs/perf.md). Each row's sums are its own whatever the split.
template <typename Dot>
void dot_block_product(const Rows& x, int64_t m0, const char* wb, int64_t steps, bool fetch, const char* next,
                       float (*c)[32]) {
  const int64_t rows = std::min<int64_t>(32, x.M - m0);
  const int64_t passes = (rows + kDotRows - 1) / kDotRows;
  const int64_t per = (rows + passes - 1) / passes;
  for (int64_t r = 0, part = 0; r < rows; r += per, ++part) {
    const Share share{fetch && passes > 1 ? next : nullptr, part, passes};
    kDotPasses<Dot>[std::min<int64_t>(per, rows - r) - 1](x, m0 + r, wb, steps, fetch && r == 0, next, share,
                                                          &c[r][0]);
  }
}

// Row r of c plus the bias's 32 values at bs (if any): the float32 sums, as two vectors.
inline void biased_row(const float (*c)[32], int64_t r, const float* bs, __m512& lo, __m512& hi) {
  lo = _mm512_load_ps(&c[r][0]);
  hi = _mm512_load_ps(&c[r][16]);
  if (bs != nullptr) {
    lo = _mm512_add_ps(lo, _mm512_loadu_ps(bs));
    hi = _mm512_add_ps(hi, _mm512_loadu_ps(bs + 16));
  }
}

// Row r of c (plus the bias's 32 values at bs, if any) into out as Dot's dtype: float32 as summed, bfloat16
// rounded to nearest even (as oneDNN and ATen round).
template <typename Dot>
inline void store_row(const float (*c)[32], int64_t r, const float* bs, typename Dot::Elem* out) {
  __m512 lo, hi;
  biased_row(c, r, bs, lo, hi);
  if constexpr (std::is_same_v<Dot, F32Dot>) {
    _mm512_storeu_ps(out, lo);
    _mm512_storeu_ps(out + 16, hi);
  } else {
#ifdef MCPMUX_PACKED
    _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
#endif
  }
}

// x's rows as the products read them, with (for the tiles, `padded`) the zero-padded copy of its last rows kept
// alive in `tail`.
Rows rows_of(const torch::Tensor& x, torch::Tensor& tail, bool padded) {
  const int64_t M = x.size(0), K = x.size(1), whole = padded ? M / 16 * 16 : M, bytes = x.element_size();
  if (whole < M) {
    tail = torch::zeros({16, K}, x.options());
    tail.narrow(0, 0, M - whole).copy_(x.narrow(0, whole, M - whole));
  }
  return Rows{reinterpret_cast<const char*>(x.data_ptr()),
              whole < M ? reinterpret_cast<const char*>(tail.data_ptr()) : nullptr, M, whole, x.stride(0) * bytes,
              K * bytes};
}

torch::Tensor float_bias(const c10::optional<torch::Tensor>& bias) {
  return bias.has_value() ? bias->to(torch::kFloat32).contiguous() : torch::Tensor();
}

}  // namespace
#endif

#ifdef MCPMUX_AMX
namespace {

struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

// Tiles 0-3: accumulators; 4, 5: rows of x; 6, 7: weights. Every tile 16 rows of 64 bytes.
void configure_tiles() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) {
    config.rows[t] = 16;
    config.colsb[t] = 64;
  }
  _tile_loadconfig(&config);
}

// Linux hands a process the tile state only when asked (ARCH_REQ_XCOMP_PERM for XTILEDATA).
bool tiles_allowed() {
  static const bool allowed = syscall(SYS_arch_prctl, 0x1023, 18) == 0;
  return allowed;
}

// Rows m0 .. m0 + 31 (those below M) of bfloat16 x times the 32-column weight block at wb, into c (float). With
// `fetch`, the weights ahead are prefetched as it multiplies (kPrefetchL1 and kPrefetchL2 steps), running on
// into `next` (the block this thread multiplies next, or nullptr), so that memory streams from one block into
// the next.
void tile_block_product(const Rows& x, int64_t m0, const char* wb, int64_t steps, bool fetch, const char* next,
                        float (*c)[32]) {
  const bool two = m0 + 16 < x.M;
  int64_t s0 = 0, s1 = 0;
  const char* a0 = x.at(m0, s0);
  const char* a1 = two ? x.at(m0 + 16, s1) : nullptr;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < steps; ++k) {
    const char* b = wb + k * 2048;
    if (fetch) {
      prefetch_step<_MM_HINT_T0>(weights_at(wb, steps, next, k + kPrefetchL1));
      prefetch_step<_MM_HINT_T1>(weights_at(wb, steps, next, k + kPrefetchL2));
    }
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 1024, 64);
    _tile_loadd(4, a0 + k * 64, s0);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, a1 + k * 64, s1);
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, &c[0][0], 128);
  _tile_stored(1, &c[0][16], 128);
  if (two) {
    _tile_stored(2, &c[16][0], 128);
    _tile_stored(3, &c[16][16], 128);
  }
}

}  // namespace
#endif

// Whether this build multiplies on AMX tiles where the OS allows them.
bool built() {
#ifdef MCPMUX_AMX
  return true;
#else
  return false;
#endif
}

// Whether this build multiplies bfloat16 on the packed layout at all (AVX512-BF16 dot products, and tiles where
// built).
bool packed_built() {
#ifdef MCPMUX_PACKED
  return true;
#else
  return false;
#endif
}

// Whether this build multiplies float32 on the packed layout (AVX-512 FMAs).
bool packed_f32_built() {
#ifdef MCPMUX_PACKED_F32
  return true;
#else
  return false;
#endif
}

#ifdef MCPMUX_PACKED_F32
namespace {

// Whether the tiles multiply a Dot product in this process: bfloat16 where the OS allows them (else the dot
// products do, on every product alike).
template <typename Dot>
bool on_tiles() {
#ifdef MCPMUX_AMX
  if constexpr (std::is_same_v<Dot, Bf16Dot>) return tiles_allowed();
#endif
  return false;
}

// One thread's share of a product: rows m0 .. m0 + 31 (those below M) of x times the 32-column weight block at
// wb, into c (float), on the tiles (configured for the share's whole life) or with dot products. With `fetch`,
// the weights ahead are prefetched as it multiplies, running on into `next` (the block this thread multiplies
// next, or nullptr), so that memory streams from one block into the next.
template <typename Dot>
class BlockProduct {
 public:
  BlockProduct() : tiles_(on_tiles<Dot>()) {
#ifdef MCPMUX_AMX
    if (tiles_) configure_tiles();
#endif
  }
  ~BlockProduct() {
#ifdef MCPMUX_AMX
    if (tiles_) _tile_release();
#endif
  }
  BlockProduct(const BlockProduct&) = delete;
  BlockProduct& operator=(const BlockProduct&) = delete;

  void operator()(const Rows& x, int64_t m0, const char* wb, int64_t steps, bool fetch, const char* next,
                  float (*c)[32]) const {
#ifdef MCPMUX_AMX
    if (tiles_) return tile_block_product(x, m0, wb, steps, fetch, next, c);
#endif
    dot_block_product<Dot>(x, m0, wb, steps, fetch, next, c);
  }

 private:
  const bool tiles_;
};

// x [M, K] (contiguous rows) times the packed weight w, each thread taking whole 32-column blocks; for each
// block 32 rows at a time are summed into float32 and handed to emit(c, rows, m0, block).
template <typename Dot, typename Emit>
void each_block(const torch::Tensor& x, const torch::Tensor& w, const Emit& emit) {
  const int64_t M = x.size(0), steps = w.size(1);
  torch::Tensor tail;
  const Rows rows = rows_of(x, tail, on_tiles<Dot>());
  const char* ws = reinterpret_cast<const char*>(w.data_ptr());
  pool::parallel_for(0, w.size(0), 1, [&](int64_t begin, int64_t end) {
    const BlockProduct<Dot> block_product;
    alignas(64) float c[32][32];
    for (int64_t block = begin; block < end; ++block) {
      const char* wb = ws + block * steps * 2048;
      const char* next = block + 1 < end ? wb + steps * 2048 : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += 32) {
        block_product(rows, m0, wb, steps, m0 == 0, next, c);
        emit(c, std::min<int64_t>(32, M - m0), m0, block);
      }
    }
  });
}

// linear's packed product for Dot's dtype, written as that dtype (store_row); with `widen` (bfloat16 only), those
// values as float32.
template <typename Dot>
torch::Tensor packed_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                            bool widen) {
  using Elem = typename Dot::Elem;
  widen = widen && !std::is_same_v<Elem, float>;
  const int64_t M = x.size(0), N = w.size(0) * 32;
  auto out = torch::empty({M, N}, x.options().dtype(widen ? torch::kFloat32 : x.scalar_type()));
  const torch::Tensor bias_f = float_bias(bias);
  const float* bs = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  each_block<Dot>(x, w, [&](const float (*c)[32], int64_t rows, int64_t m0, int64_t block) {
    const float* row_bias = bs == nullptr ? nullptr : bs + block * 32;
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t at = (m0 + r) * N + block * 32;
      if (!widen) {
        store_row<Dot>(c, r, row_bias, reinterpret_cast<Elem*>(out.data_ptr()) + at);
        continue;
      }
      if constexpr (!std::is_same_v<Elem, float>) {
        alignas(64) Elem rounded[32];
        store_row<Dot>(c, r, row_bias, rounded);
        for (int half = 0; half < 2; ++half) {
          const __m256i bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(rounded + half * 16));
          _mm512_storeu_si512(reinterpret_cast<float*>(out.data_ptr()) + at + half * 16,
                              _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
        }
      }
    }
  });
  return out;
}

// gated_linear's product for Dot's dtype (see there).
template <typename Dot, typename Act>
torch::Tensor packed_gated_linear(const torch::Tensor& x, const torch::Tensor& w,
                                  const c10::optional<torch::Tensor>& bias, const Act& act) {
  const int64_t M = x.size(0), half = w.size(0) / 2, I = half * 32, steps = w.size(1);
  using Elem = typename Dot::Elem;
  auto out = torch::empty({M, I}, x.options());
  auto* os = reinterpret_cast<Elem*>(out.data_ptr());
  torch::Tensor tail;
  const Rows rows = rows_of(x, tail, on_tiles<Dot>());
  const char* ws = reinterpret_cast<const char*>(w.data_ptr());
  const torch::Tensor bias_f = float_bias(bias);
  const float* bs = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  pool::parallel_for(0, half, 1, [&](int64_t begin, int64_t end) {
    const BlockProduct<Dot> block_product;
    alignas(64) float gate[32][32], up[32][32];
    for (int64_t block = begin; block < end; ++block) {
      const char* gate_w = ws + block * steps * 2048;
      const char* up_w = ws + (half + block) * steps * 2048;
      const char* next = block + 1 < end ? gate_w + steps * 2048 : nullptr;
      const float* gate_bias = bs == nullptr ? nullptr : bs + block * 32;
      const float* up_bias = bs == nullptr ? nullptr : bs + (half + block) * 32;
      for (int64_t m0 = 0; m0 < M; m0 += 32) {
        block_product(rows, m0, gate_w, steps, m0 == 0, up_w, gate);
        block_product(rows, m0, up_w, steps, m0 == 0, next, up);
        for (int64_t r = 0; r < std::min<int64_t>(32, M - m0); ++r) {
          alignas(64) Elem gate_row[32], up_row[32];
          store_row<Dot>(gate, r, gate_bias, gate_row);
          store_row<Dot>(up, r, up_bias, up_row);
          act(gate_row, up_row, os + (m0 + r) * I + block * 32);
        }
      }
    }
  });
  return out;
}

}  // namespace
#endif

void check_weight(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(is_packed(w) && w.is_contiguous(),
              "a packed weight is a contiguous bfloat16 [N/32, K/32, 2, 16, 16, 2] or float32 [N/32, K/16, 2, 16, 16] "
              "tensor");
  const int64_t K = w.size(1) * (w.dim() == 6 ? 32 : 16);
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "] for this weight");
}

// Whether `x` times the packed weight `w` runs on the packed layout here (the tiles, dot products or FMAs), else on
// the unpacked weight, with ATen.
bool runs_packed(const torch::Tensor& x, const torch::Tensor& w) {
#ifdef MCPMUX_PACKED_F32
  if (x.scalar_type() != w.scalar_type()) return false;
#ifdef MCPMUX_PACKED
  if (w.dim() == 6) return true;
#endif
  return w.dim() == 5;
#else
  return false;
#endif
}

// x [M, K] times the packed weight w: [M, N] in x's dtype, plus bias; with `widen`, bfloat16 results as float32
// (the output head's logits: the same values as widening the bfloat16 result, in one pass).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                     bool widen = false) {
  RECORD_FUNCTION("mcpmux::amx_linear", {});
  check_weight(x, w);
#ifdef MCPMUX_PACKED_F32
  if (runs_packed(x, w)) {
    if (x.stride(1) != 1) return amx::linear(x.contiguous(), w, bias, widen);
#ifdef MCPMUX_PACKED
    if (w.dim() == 6) return packed_linear<Bf16Dot>(x, w, bias, widen);
#endif
    return packed_linear<F32Dot>(x, w, bias, widen);
  }
#endif
  const auto product = at::linear(x, unpacked(w).to(x.scalar_type()), bias);
  return widen ? product.to(torch::kFloat32) : product;
}

// act(gate, up) for a packed [gate | up] weight w (2I output columns, I a multiple of 32): [M, I] in x's dtype,
// each gate and up value as `linear` gives it (bfloat16: rounded), then `act(gate, up, out)` on 32 of each at a
// time (float or c10::BFloat16 pointers), so the result is act's on linear's output bit for bit, without writing
// that output out and reading it back. The gate block and its up block are multiplied one after the other, the
// weights streaming from one into the next. Only where runs_packed(x, w); the caller checks.
template <typename Act>
torch::Tensor gated_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                           const Act& act) {
  RECORD_FUNCTION("mcpmux::amx_gated_linear", {});
  check_weight(x, w);
  TORCH_CHECK(w.size(0) % 2 == 0, "a gated weight holds [gate | up] in whole 32-column blocks each");
  TORCH_CHECK(runs_packed(x, w), "gated_linear needs AVX-512 (AVX512-BF16 or AMX for bfloat16) and rows of w's dtype");
#ifdef MCPMUX_PACKED_F32
  if (x.stride(1) != 1) return gated_linear(x.contiguous(), w, bias, act);
#ifdef MCPMUX_PACKED
  if (w.dim() == 6) return packed_gated_linear<Bf16Dot>(x, w, bias, act);
#endif
  return packed_gated_linear<F32Dot>(x, w, bias, act);
#else
  return torch::Tensor();
#endif
}

}  // namespace amx
"""
