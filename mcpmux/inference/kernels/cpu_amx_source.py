"""C++ source of the kernels' bfloat16 matrix product on a packed weight layout: on Intel AMX tiles, or with
AVX512-BF16 dot products on CPUs without AMX (AMD Zen 4 and later), built with the fused CPU kernels
(`cpu_fused` puts it before `cpu_fused_source.SOURCE`, whose `linear` and `swiglu` call it).

A decode step multiplies a few dozen rows by every weight, so it is bound by reading the weights
from memory. On 2 cores of a Xeon with AMX, oneDNN's bfloat16 product reads SmolLM2's weights at
7-19 GB/s at 1-32 rows; this one streams them at 17-34 GB/s (1.5-2.3x oneDNN; about equal from 64
rows up, `benchmarks/cpu_products.py`) because its weight is laid out in exactly the order its tiles
read it. On an AMD Zen 5 the dot products run 1.1-1.6x oneDNN's product at 1-64 rows.

**Layout** (`models.linear.pack_bf16`): a [N, K] weight becomes a [N/32, K/32, 2, 16, 16, 2] tensor.
For each block of 32 output columns, for each 32-wide step along K, two 1 KiB B tiles (16 columns
each) in the VNNI form `TDPBF16PS` reads: row p of a tile holds, for each of its 16 columns, the
weights at k = 2p and 2p + 1. A block's tiles follow one another, so a thread reads its columns'
weights as one sequential stream, prefetched into L2 `kPrefetchL2` steps ahead and into L1
`kPrefetchL1` steps ahead; with dot products, the passes over a block also fetch the next block into L2
(`Share`).

**Product**: each thread takes whole 32-column blocks; for each block it walks 32 rows of x at a time,
then rounds the float32 sums to bfloat16 (to nearest even, as oneDNN and ATen round). On AMX tiles
(`tile_block_product`): two A tiles of 16 rows, four 16 x 16 float32 accumulators in tiles over all
of K; rows of x past the last whole 16 are read from a zero-padded copy. With dot products
(`dot_block_product`): passes of up to 12 rows, each row's 32 outputs in two 16-lane accumulators,
and for each pair of K the row's two values broadcast against the tile row holding that pair
(`VDPBF16PS`): the layout's tile rows are exactly that operand. Either way an output's sum runs in
an order fixed by K alone, whatever rows share the product (batch invariance, `cpu_fused`), and in
another order than ATen's, so results match `F.linear` to bfloat16 rounding, not bit for bit.

**Gated product** (`amx::gated_linear`, the SwiGLU MLP's gate-up product for the one-call decoder):
a [gate | up] weight's gate block and its up block are multiplied one after the other, rounded to
bfloat16 as `linear` rounds them, and handed 32 columns at a time to the activation (SiLU x up, from
`cpu_fused_source`), so the result is the activation of `linear`'s output bit for bit without the
[M, 2I] product ever being written out and read back.

Compiled only where the compiler targets AVX512-BF16 (`-march=native` on such a CPU), the tiles only
where it targets AMX-BF16 too; a process the OS refuses the tile state multiplies with dot products.
Elsewhere `amx::linear` multiplies the unpacked weight with ATen (the Python side packs weights only on
CPUs with AMX or AVX512-BF16, so that path is a safety net, not a code path).
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#if defined(__AVX512BF16__)
#include <immintrin.h>
#define MCPMUX_PACKED 1  // the packed layout has a product here: AVX512-BF16 dot products, AMX tiles too below
#endif
#if defined(MCPMUX_PACKED) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#include <sys/syscall.h>
#include <unistd.h>
#define MCPMUX_AMX 1
#endif

namespace amx {

// The packed weight back as [N, K] (the fallback's operand; the Python side has the same in torch).
torch::Tensor unpacked(const torch::Tensor& w) {
  return w.permute({0, 2, 4, 1, 3, 5}).reshape({w.size(0) * 32, w.size(1) * 32});
}

#ifdef MCPMUX_PACKED
namespace {

// How far ahead the weights are prefetched, in K steps of 2 KiB: into L1 just before the product reads them,
// and into L2 well before (without the second, a decode step's products took 3-7% longer on AMX, docs/perf.md).
constexpr int64_t kPrefetchL1 = 2, kPrefetchL2 = 8;

// The rows of x a product reads: rows below `whole` in place, the rest (the tiles' last partial 16) from a
// zero-padded copy.
struct Rows {
  const uint16_t* xs;
  const uint16_t* tail;  // the rows after the last whole 16, zero-padded to 16
  int64_t M, K, whole, ldx;

  const uint16_t* at(int64_t r, int64_t& stride_bytes) const {
    if (r < whole) {
      stride_bytes = ldx * 2;
      return xs + r * ldx;
    }
    stride_bytes = K * 2;
    return tail;
  }
};

// The 2 KiB of weights `at` steps into the block at wb (`steps` long), running on into `next` (a block as
// long, or nullptr): a step past both is nullptr.
inline const char* weights_at(const uint16_t* wb, int64_t steps, const uint16_t* next, int64_t at) {
  if (at < steps) return reinterpret_cast<const char*>(wb + at * 1024);
  if (next == nullptr || at >= 2 * steps) return nullptr;
  return reinterpret_cast<const char*>(next + (at - steps) * 1024);
}

// Always inlined: a function that only prefetches has no side effects to GCC, which may then drop calls to it.
template <int Hint>
__attribute__((always_inline)) inline void prefetch_step(const char* p) {
  if (p == nullptr) return;
  for (int line = 0; line < 2048; line += 64) _mm_prefetch(p + line, static_cast<_mm_hint>(Hint));
}

// A dot-product pass's share of the next block's weights, fetched into L2 as it multiplies this block: pass
// `part` of `parts` fetches the part-th of the next block's lines, a few with each K step. Only a block's first
// pass reads it from memory, at the pace of 12 rows' dot products (faster than memory feeds two cores), and
// the passes after it read nothing; spread over all of them, the next block streams in at an even, lower rate
// (32-row products from memory 3% faster, docs/perf.md).
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

// Rows r0 .. r0 + R - 1 of x times the 32-column weight block at wb into c (R rows of 32 floats, 32 apart), with
// AVX512-BF16 dot products: for each pair of K in order, the row's two values broadcast against the tile row
// holding that pair for 16 columns (the packed layout's rows are exactly that operand), so every output is
// one float32 sum over K in the same order whatever the rows beside it. R rows keep 2R accumulators in
// registers; with `fetch` the weights ahead are prefetched as for the tiles.
template <int R>
void dot_rows(const Rows& x, int64_t r0, const uint16_t* wb, int64_t steps, bool fetch, const uint16_t* next,
              Share share, float* c) {
  __m512 lo[R], hi[R];
  const int32_t* pairs[R];
#pragma GCC unroll 16
  for (int r = 0; r < R; ++r) {
    lo[r] = _mm512_setzero_ps();
    hi[r] = _mm512_setzero_ps();
    pairs[r] = reinterpret_cast<const int32_t*>(x.xs + (r0 + r) * x.ldx);
  }
  for (int64_t k = 0; k < steps; ++k) {
    const uint16_t* b = wb + k * 1024;
    if (fetch) {
      prefetch_step<_MM_HINT_T0>(weights_at(wb, steps, next, k + kPrefetchL1));
      prefetch_step<_MM_HINT_T1>(weights_at(wb, steps, next, k + kPrefetchL2));
    }
    share.fetch(k, steps);
    for (int p = 0; p < 16; ++p) {
      const __m512bh w0 = (__m512bh)_mm512_loadu_si512(b + p * 32);
      const __m512bh w1 = (__m512bh)_mm512_loadu_si512(b + 512 + p * 32);
#pragma GCC unroll 16
      for (int r = 0; r < R; ++r) {
        const __m512bh pair = (__m512bh)_mm512_set1_epi32(pairs[r][k * 16 + p]);
        lo[r] = _mm512_dpbf16_ps(lo[r], pair, w0);
        hi[r] = _mm512_dpbf16_ps(hi[r], pair, w1);
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
using DotRows = void (*)(const Rows&, int64_t, const uint16_t*, int64_t, bool, const uint16_t*, Share, float*);
const DotRows kDotPasses[kDotRows] = {&dot_rows<1>, &dot_rows<2>, &dot_rows<3>,  &dot_rows<4>,
                                      &dot_rows<5>, &dot_rows<6>, &dot_rows<7>,  &dot_rows<8>,
                                      &dot_rows<9>, &dot_rows<10>, &dot_rows<11>, &dot_rows<12>};

// block_product's contract (below) with dot products: rows m0 .. m0 + 31 in passes of up to kDotRows, the
// first streaming the block's weights from memory (and prefetching ahead), the others reading them from cache
// (taking K a few steps at a time through all the passes measured no faster).
void dot_block_product(const Rows& x, int64_t m0, const uint16_t* wb, int64_t steps, bool fetch,
                       const uint16_t* next, float (*c)[32]) {
  const int64_t rows = std::min<int64_t>(32, x.M - m0);
  const int64_t passes = (rows + kDotRows - 1) / kDotRows;
  for (int64_t r = 0; r < rows; r += kDotRows) {
    const Share share{fetch ? reinterpret_cast<const char*>(next) : nullptr, r / kDotRows, passes};
    kDotPasses[std::min<int64_t>(kDotRows, rows - r) - 1](x, m0 + r, wb, steps, fetch && r == 0, next, share,
                                                          &c[r][0]);
  }
}

// Row r of c (plus the bias's 32 values at bs, if any) rounded to bfloat16 into out (to nearest even, as
// oneDNN and ATen round).
inline void round_row(const float (*c)[32], int64_t r, const float* bs, uint16_t* out) {
  __m512 lo = _mm512_load_ps(&c[r][0]), hi = _mm512_load_ps(&c[r][16]);
  if (bs != nullptr) {
    lo = _mm512_add_ps(lo, _mm512_loadu_ps(bs));
    hi = _mm512_add_ps(hi, _mm512_loadu_ps(bs + 16));
  }
  _mm512_storeu_si512(out, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
}

// x's rows as the products read them, with (for the tiles, `padded`) the zero-padded copy of its last rows kept
// alive in `tail`.
Rows rows_of(const torch::Tensor& x, int64_t K, torch::Tensor& tail, bool padded) {
  const int64_t M = x.size(0), whole = padded ? M / 16 * 16 : M;
  if (whole < M) {
    tail = torch::zeros({16, K}, x.options());
    tail.narrow(0, 0, M - whole).copy_(x.narrow(0, whole, M - whole));
  }
  return Rows{reinterpret_cast<const uint16_t*>(x.data_ptr()),
              whole < M ? reinterpret_cast<const uint16_t*>(tail.data_ptr()) : nullptr, M, K, whole, x.stride(0)};
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

// Rows m0 .. m0 + 31 (those below M) of x times the 32-column weight block at wb, into c (float). With
// `fetch`, the weights ahead are prefetched as it multiplies (kPrefetchL1 and kPrefetchL2 steps), running on
// into `next` (the block this thread multiplies next, or nullptr), so that memory streams from one block into
// the next.
void tile_block_product(const Rows& x, int64_t m0, const uint16_t* wb, int64_t steps, bool fetch, const uint16_t* next,
                   float (*c)[32]) {
  const bool two = m0 + 16 < x.M;
  int64_t s0 = 0, s1 = 0;
  const uint16_t* a0 = x.at(m0, s0);
  const uint16_t* a1 = two ? x.at(m0 + 16, s1) : nullptr;
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  for (int64_t k = 0; k < steps; ++k) {
    const uint16_t* b = wb + k * 1024;
    if (fetch) {
      prefetch_step<_MM_HINT_T0>(weights_at(wb, steps, next, k + kPrefetchL1));
      prefetch_step<_MM_HINT_T1>(weights_at(wb, steps, next, k + kPrefetchL2));
    }
    _tile_loadd(6, b, 64);
    _tile_loadd(7, b + 512, 64);
    _tile_loadd(4, a0 + k * 32, s0);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (two) {
      _tile_loadd(5, a1 + k * 32, s1);
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

// Whether this build multiplies the packed layout at all (AVX512-BF16 dot products, and tiles where built).
bool packed_built() {
#ifdef MCPMUX_PACKED
  return true;
#else
  return false;
#endif
}

#ifdef MCPMUX_PACKED
namespace {

// Whether the tiles multiply in this process (else the dot products do, on every product alike).
bool on_tiles() {
#ifdef MCPMUX_AMX
  return tiles_allowed();
#else
  return false;
#endif
}

// One thread's share of a product: rows m0 .. m0 + 31 (those below M) of x times the 32-column weight block at
// wb, into c (float), on the tiles (configured for the share's whole life) or with dot products. With `fetch`,
// the weights ahead are prefetched as it multiplies, running on into `next` (the block this thread multiplies
// next, or nullptr), so that memory streams from one block into the next.
class BlockProduct {
 public:
  BlockProduct() : tiles_(on_tiles()) {
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

  void operator()(const Rows& x, int64_t m0, const uint16_t* wb, int64_t steps, bool fetch, const uint16_t* next,
                  float (*c)[32]) const {
#ifdef MCPMUX_AMX
    if (tiles_) return tile_block_product(x, m0, wb, steps, fetch, next, c);
#endif
    dot_block_product(x, m0, wb, steps, fetch, next, c);
  }

 private:
  const bool tiles_;
};

}  // namespace
#endif

void check_weight(const torch::Tensor& x, const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 6 && w.scalar_type() == torch::kBFloat16 && w.is_contiguous(),
              "a packed weight is a contiguous bfloat16 [N/32, K/32, 2, 16, 16, 2] tensor");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == w.size(1) * 32, "x must be [M, ", w.size(1) * 32, "] for this weight");
}

// Whether `x` times a packed weight runs on the packed layout here, on the tiles or with dot products (else on
// the unpacked weight, with ATen).
bool runs_packed(const torch::Tensor& x) {
#ifdef MCPMUX_PACKED
  return x.scalar_type() == torch::kBFloat16;
#else
  return false;
#endif
}

// x [M, K] bfloat16 times the packed weight w: [M, N] bfloat16, plus bias; with `widen`, those bfloat16 values
// as float32 (the output head's logits: the same values as widening the bfloat16 result, in one pass).
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                     bool widen = false) {
  RECORD_FUNCTION("mcpmux::amx_linear", {});
  check_weight(x, w);
#ifdef MCPMUX_PACKED
  if (runs_packed(x)) {
    if (x.stride(1) != 1) return amx::linear(x.contiguous(), w, bias, widen);
    const int64_t M = x.size(0), N = w.size(0) * 32, K = w.size(1) * 32, steps = w.size(1);
    auto out = torch::empty({M, N}, x.options().dtype(widen ? torch::kFloat32 : torch::kBFloat16));
    torch::Tensor tail;
    const Rows rows = rows_of(x, K, tail, on_tiles());
    const auto* ws = reinterpret_cast<const uint16_t*>(w.data_ptr());
    auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
    auto* wide = reinterpret_cast<float*>(out.data_ptr());
    const torch::Tensor bias_f = float_bias(bias);
    const float* bs = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
    pool::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
      const BlockProduct block_product;
      alignas(64) float c[32][32];
      alignas(64) uint16_t rounded[32];
      for (int64_t block = begin; block < end; ++block) {
        const uint16_t* wb = ws + block * steps * 1024;
        const uint16_t* next = block + 1 < end ? wb + steps * 1024 : nullptr;
        for (int64_t m0 = 0; m0 < M; m0 += 32) {
          block_product(rows, m0, wb, steps, m0 == 0, next, c);
          for (int64_t r = 0; r < std::min<int64_t>(32, M - m0); ++r) {
            const float* row_bias = bs == nullptr ? nullptr : bs + block * 32;
            if (!widen) {
              round_row(c, r, row_bias, os + (m0 + r) * N + block * 32);
              continue;
            }
            round_row(c, r, row_bias, rounded);
            for (int half = 0; half < 2; ++half) {
              const __m256i bits = _mm256_load_si256(reinterpret_cast<const __m256i*>(rounded + half * 16));
              _mm512_storeu_si512(wide + (m0 + r) * N + block * 32 + half * 16,
                                  _mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
            }
          }
        }
      }
    });
    return out;
  }
#endif
  const auto product = at::linear(x, unpacked(w).to(x.scalar_type()), bias);
  return widen ? product.to(torch::kFloat32) : product;
}

// act(gate, up) for a packed [gate | up] weight w (2I output columns, I a multiple of 32): [M, I] bfloat16,
// each gate and up value rounded to bfloat16 as `linear` rounds them, then `act(gate, up, out)` on 32 of
// each at a time, so the result is act's on linear's output bit for bit, without writing that output
// out and reading it back. The gate block and its up block are multiplied one after the other, the
// weights streaming from one into the next. Only where runs_packed(x); the caller checks.
template <typename Act>
torch::Tensor gated_linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias,
                           Act act) {
  RECORD_FUNCTION("mcpmux::amx_gated_linear", {});
  check_weight(x, w);
  TORCH_CHECK(w.size(0) % 2 == 0, "a gated weight holds [gate | up] in whole 32-column blocks each");
  TORCH_CHECK(runs_packed(x), "gated_linear needs AVX512-BF16 (or AMX) and bfloat16 rows");
#ifdef MCPMUX_PACKED
  if (x.stride(1) != 1) return gated_linear(x.contiguous(), w, bias, act);
  const int64_t M = x.size(0), half = w.size(0) / 2, I = half * 32, K = w.size(1) * 32, steps = w.size(1);
  auto out = torch::empty({M, I}, x.options());
  torch::Tensor tail;
  const Rows rows = rows_of(x, K, tail, on_tiles());
  const auto* ws = reinterpret_cast<const uint16_t*>(w.data_ptr());
  auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
  const torch::Tensor bias_f = float_bias(bias);
  const float* bs = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
  pool::parallel_for(0, half, 1, [&](int64_t begin, int64_t end) {
    const BlockProduct block_product;
    alignas(64) float gate[32][32], up[32][32];
    alignas(64) uint16_t gate_row[32], up_row[32];
    for (int64_t block = begin; block < end; ++block) {
      const uint16_t* gate_w = ws + block * steps * 1024;
      const uint16_t* up_w = ws + (half + block) * steps * 1024;
      const uint16_t* next = block + 1 < end ? gate_w + steps * 1024 : nullptr;
      for (int64_t m0 = 0; m0 < M; m0 += 32) {
        block_product(rows, m0, gate_w, steps, m0 == 0, up_w, gate);
        block_product(rows, m0, up_w, steps, m0 == 0, next, up);
        for (int64_t r = 0; r < std::min<int64_t>(32, M - m0); ++r) {
          round_row(gate, r, bs == nullptr ? nullptr : bs + block * 32, gate_row);
          round_row(up, r, bs == nullptr ? nullptr : bs + (half + block) * 32, up_row);
          act(gate_row, up_row, os + (m0 + r) * I + block * 32);
        }
      }
    }
  });
  return out;
#else
  return torch::Tensor();
#endif
}

}  // namespace amx
"""
