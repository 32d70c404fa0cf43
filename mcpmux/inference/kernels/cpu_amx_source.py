"""C++ source of the bfloat16 matrix product on Intel AMX tiles, built with the fused CPU kernels
(`cpu_fused` puts it before `cpu_fused_source.SOURCE`, whose `linear` calls `amx::linear`).

A decode step multiplies a few dozen rows by every weight, so it is bound by reading the weights
from memory. On 2 cores of a Xeon with AMX, oneDNN's bfloat16 product reads SmolLM2's weights at
7-19 GB/s at 1-32 rows; this one streams them at 17-34 GB/s (1.5-2.3x oneDNN; about equal from 64
rows up, `benchmarks/cpu_products.py`) because its weight is laid out in exactly the order its tiles
read it.

**Layout** (`models.linear.amx_pack`): a [N, K] weight becomes a [N/32, K/32, 2, 16, 16, 2] tensor.
For each block of 32 output columns, for each 32-wide step along K, two 1 KiB B tiles (16 columns
each) in the VNNI form `TDPBF16PS` reads: row p of a tile holds, for each of its 16 columns, the
weights at k = 2p and 2p + 1. A block's tiles follow one another, so a thread reads its columns'
weights as one sequential stream, prefetched `kPrefetch` steps ahead.

**Product**: each thread takes whole 32-column blocks; for each block it walks 32 rows of x at a time
(two A tiles of 16 rows), keeping four 16 x 16 float32 accumulators in tiles over all of K, then
rounds them to bfloat16 (to nearest even, as oneDNN and ATen round). Rows of x past the last whole
16 are read from a zero-padded copy. The sums run in another order than ATen's, so results match
`F.linear` to bfloat16 rounding, not bit for bit.

Compiled only where the compiler targets AMX-BF16 (`-march=native` on such a CPU); elsewhere, and
where the OS refuses the tile state, `amx::linear` multiplies the unpacked weight with ATen (the
Python side packs weights only on CPUs with AMX, so that path is a safety net, not a code path).
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define MCPMUX_AMX 1
#endif

namespace amx {

// The packed weight back as [N, K] (the fallback's operand; the Python side has the same in torch).
torch::Tensor unpacked(const torch::Tensor& w) {
  return w.permute({0, 2, 4, 1, 3, 5}).reshape({w.size(0) * 32, w.size(1) * 32});
}

#ifdef MCPMUX_AMX
namespace {

constexpr int64_t kPrefetch = 2;  // K steps (2 KiB of weights each) ahead

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

}  // namespace
#endif

// Whether this build multiplies on AMX tiles (else `linear` below multiplies the unpacked weight).
bool built() {
#ifdef MCPMUX_AMX
  return true;
#else
  return false;
#endif
}

// x [M, K] bfloat16 times the packed weight w: [M, N] bfloat16, plus bias.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& w, const c10::optional<torch::Tensor>& bias) {
  RECORD_FUNCTION("mcpmux::amx_linear", {});
  const int64_t M = x.size(0), N = w.size(0) * 32, K = w.size(1) * 32, steps = w.size(1);
  TORCH_CHECK(w.dim() == 6 && w.scalar_type() == torch::kBFloat16 && w.is_contiguous(),
              "an AMX weight is a contiguous bfloat16 [N/32, K/32, 2, 16, 16, 2] tensor");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == K, "x must be [M, ", K, "] for this weight");
#ifdef MCPMUX_AMX
  if (x.scalar_type() == torch::kBFloat16 && tiles_allowed()) {
    if (x.stride(1) != 1) return amx::linear(x.contiguous(), w, bias);
    auto out = torch::empty({M, N}, x.options());
    const int64_t whole = M / 16 * 16, ldx = x.stride(0);
    torch::Tensor tail;  // the rows after the last whole 16, zero-padded to 16
    if (whole < M) {
      tail = torch::zeros({16, K}, x.options());
      tail.narrow(0, 0, M - whole).copy_(x.narrow(0, whole, M - whole));
    }
    const auto* xs = reinterpret_cast<const uint16_t*>(x.data_ptr());
    const auto* ws = reinterpret_cast<const uint16_t*>(w.data_ptr());
    auto* os = reinterpret_cast<uint16_t*>(out.data_ptr());
    torch::Tensor bias_f = bias.has_value() ? bias->to(torch::kFloat32).contiguous() : torch::Tensor();
    const float* bs = bias.has_value() ? bias_f.data_ptr<float>() : nullptr;
    auto rows_at = [&](int64_t r, int64_t& stride) -> const uint16_t* {
      if (r < whole) {
        stride = ldx * 2;
        return xs + r * ldx;
      }
      stride = K * 2;
      return reinterpret_cast<const uint16_t*>(tail.data_ptr());
    };
    at::parallel_for(0, N / 32, 1, [&](int64_t begin, int64_t end) {
      configure_tiles();
      alignas(64) float c[32][32];
      const int64_t last = end * steps;  // this thread's range ends here (in K steps); no prefetch past it
      for (int64_t block = begin; block < end; ++block) {
        const uint16_t* wb = ws + block * steps * 1024;
        for (int64_t m0 = 0; m0 < M; m0 += 32) {
          const bool two = m0 + 16 < M;
          int64_t s0 = 0, s1 = 0;
          const uint16_t* a0 = rows_at(m0, s0);
          const uint16_t* a1 = two ? rows_at(m0 + 16, s1) : nullptr;
          _tile_zero(0);
          _tile_zero(1);
          _tile_zero(2);
          _tile_zero(3);
          for (int64_t k = 0; k < steps; ++k) {
            const uint16_t* b = wb + k * 1024;
            if (m0 == 0 && block * steps + k + kPrefetch < last) {
              const char* ahead = reinterpret_cast<const char*>(b + kPrefetch * 1024);
              for (int line = 0; line < 2048; line += 64) _mm_prefetch(ahead + line, _MM_HINT_T0);
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
          const int64_t rows = std::min<int64_t>(32, M - m0);
          for (int64_t r = 0; r < rows; ++r) {
            __m512 lo = _mm512_load_ps(&c[r][0]), hi = _mm512_load_ps(&c[r][16]);
            if (bs != nullptr) {
              lo = _mm512_add_ps(lo, _mm512_loadu_ps(bs + block * 32));
              hi = _mm512_add_ps(hi, _mm512_loadu_ps(bs + block * 32 + 16));
            }
            _mm512_storeu_si512(os + (m0 + r) * N + block * 32, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
          }
        }
      }
      _tile_release();
    });
    return out;
  }
#endif
  return at::linear(x, unpacked(w).to(x.scalar_type()), bias);
}

}  // namespace amx
"""
