"""C++ source of the fused CPU kernels (`cpu_fused` builds it with `torch.utils.cpp_extension.load_inline`).

Each kernel does in one pass over its rows what the torch reference does in several operators, for
float32 or bfloat16 tensors whose rows are contiguous. The arithmetic is the reference's, operation
for operation, in float32, with the same roundings to bfloat16 where the reference rounds, and with
floating-point contraction off (no fused multiply-adds the reference does not do): rotary and the KV
write match it bit for bit; SiLU * up takes its exponential from a polynomial (within an ulp or two
of ATen's), RMSNorm sums its squares, attention its scores and values, and the float32 products
their dot products in another order than the reference, so those match it to rounding. Greedy
argmax is exact (the first index of the largest value, a NaN counting as largest). For the sampler, a
row's top k (the values `torch.topk` gives, equal ones in index order) in one pass against a running
threshold, and a row's draw from softmax(row / temperature) by a given uniform number (exponentials
from the same polynomial, their running sum in float64).

Decode attention reads each context through its block table once per query row: a row's KV heads run
one after another on one thread, the first prefetching the whole cache rows (every KV head) of the keys
ahead of it, so the others find them in cache. A prefill's rows go four at a time (`attend_group`), each
key row loaded once for the four, each row's arithmetic still its own alone. bfloat16 vectors are widened
with AVX-512 instructions where the compiler targets them (GCC's generic conversion splits them into
256-bit halves).

Loops are split with `pool::parallel_for` (`cpu_pool_source`): chunks taken by the threads of a pool with
no barrier, or with `MCPMUX_CPU_POOL=0` torch's own OpenMP threads through `at::parallel_for` (compiled
with -fopenmp for the header's pragmas, not linked with it: the OpenMP symbols resolve to the runtime
torch loaded).
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

// MKL's single-precision product and its per-thread thread count, from the MKL torch links in (weak: where
// torch has no MKL they stay null and prefill products go to ATen's linear).
extern "C" {
__attribute__((weak)) void sgemm_(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                                  const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                                  const float* beta, float* c, const int* ldc);
__attribute__((weak)) int MKL_Set_Num_Threads_Local(int threads);  // mkl.h's C name (the lower-case one is Fortran's)
}

namespace {

using c10::BFloat16;

// Elements a parallel chunk should at least hold: below it, waking the other threads costs more.
constexpr int64_t kGrainElements = 16384;

template <typename T>
inline float rounded(float v) {
  return static_cast<float>(static_cast<T>(v));  // float: itself; bfloat16: round to nearest even
}

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float total = 0.0f;
#pragma omp simd reduction(+ : total)
  for (int64_t i = 0; i < n; ++i) total += a[i] * b[i];
  return total;
}

template <typename T>
inline void to_float(const T* __restrict__ src, float* __restrict__ dst, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

// Sixteen float lanes in GCC's generic vectors: one AVX-512 register, two AVX2 ones, four NEON ones.
constexpr int64_t kLanes = 16;
typedef float vf __attribute__((vector_size(64)));
typedef float vf8 __attribute__((vector_size(32)));
typedef float vf4 __attribute__((vector_size(16)));
typedef int32_t vi __attribute__((vector_size(64)));
typedef uint16_t vh __attribute__((vector_size(32)));
typedef uint32_t vu __attribute__((vector_size(64)));

inline vf load(const float* p) {
  vf v;
  std::memcpy(&v, p, sizeof(v));
  return v;
}

inline vf load(const BFloat16* p) {  // a bfloat16 is the top half of a float
#ifdef __AVX512F__
  // One widening load and a shift (GCC splits the generic conversion below into 256-bit halves).
  const __m256i half = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return (vf)_mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
#else
  vh half;
  std::memcpy(&half, p, sizeof(half));
  const vu bits = __builtin_convertvector(half, vu) << 16;
  vf v;
  std::memcpy(&v, &bits, sizeof(v));
  return v;
#endif
}

// Every lane `s` (`vf{} + s` would add 0 to it first).
inline vf splat(float s) {
#ifdef __AVX512F__
  return (vf)_mm512_set1_ps(s);
#else
  return vf{} + s;
#endif
}

inline float sum(vf v) {
  const vf8 a = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
                __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  const vf4 b = __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
  return (b[0] + b[2]) + (b[1] + b[3]);
}

inline void store(float* p, vf v) { std::memcpy(p, &v, sizeof(v)); }

// Each lane's bfloat16 bits: rounded to nearest, ties to even, a NaN to 0x7FC0 (as c10::BFloat16 rounds).
inline vu bfloat16_bits(vf v) {
  vu bits;
  std::memcpy(&bits, &v, sizeof(bits));
  const vu rounded = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16;
  const vi nan = v != v;
  return nan ? vu{} + 0x7FC0 : rounded;
}

inline void store(BFloat16* p, vf v) {
  const vh half = __builtin_convertvector(bfloat16_bits(v), vh);
  std::memcpy(p, &half, sizeof(half));
}

template <typename T>
inline vf rounded(vf v) {  // float: itself; bfloat16: rounded to it and back
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    const vu bits = bfloat16_bits(v) << 16;
    vf out;
    std::memcpy(&out, &bits, sizeof(out));
    return out;
  }
}

// The four sums of a, b, c and d, each folded in halves as `sum` folds one.
inline vf4 sum4(vf a, vf b, vf c, vf d) {
  const vf ab = __builtin_shufflevector(a, b, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(a, b, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const vf cd = __builtin_shufflevector(c, d, 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23) +
                __builtin_shufflevector(c, d, 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31);
  const vf x = __builtin_shufflevector(ab, cd, 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27) +
               __builtin_shufflevector(ab, cd, 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31);
  const vf8 y = __builtin_shufflevector(x, x, 0, 1, 4, 5, 8, 9, 12, 13) +
                __builtin_shufflevector(x, x, 2, 3, 6, 7, 10, 11, 14, 15);
  return __builtin_shufflevector(y, y, 0, 2, 4, 6) + __builtin_shufflevector(y, y, 1, 3, 5, 7);
}

// exp(x) to about an ulp, lane by lane (Cephes' expf: 2^n times a polynomial of the remainder).
inline vf exp_approx(vf x) {
  constexpr float low = -87.3365447f, high = 88.3762626f, log2e = 1.44269504088896341f;
  constexpr float poly[] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f, 4.1665795894e-2f,
                            1.6666665459e-1f, 5.0000001201e-1f};
  x = x < low ? vf{} + low : x;
  x = x > high ? vf{} + high : x;
  const vf t = x * log2e + 0.5f;
  vi n_int = __builtin_convertvector(t, vi);  // toward zero, then down to the floor
  vf n = __builtin_convertvector(n_int, vf);
  const vi above = n > t;
  n_int += above;  // -1 where the truncation was above t
  n = above ? n - 1.0f : n;
  vf r = x - n * 0.693359375f;  // ln 2 in two parts, so that r keeps its low bits
  r = r - n * -2.12194440e-4f;
  vf p = r * poly[0] + poly[1];
  for (int i = 2; i < 6; ++i) p = p * r + poly[i];
  p = p * (r * r) + r + 1.0f;
  const vi bits = (n_int + 127) << 23;
  vf scale;
  std::memcpy(&scale, &bits, sizeof(scale));
  return p * scale;
}

int64_t padded(int64_t len) { return (len + kLanes - 1) / kLanes * kLanes; }

// p[0:len] = exp(p - max(p)) / sum, with the exponentials above, sixteen at a time: p holds padded(len)
// floats, the padding set to -inf here (out of the max) and to 0 after it. Never inlined: inlined into
// attention (fp-contract=fast, below) its exponential's products and sums could fuse or not with how each
// caller was inlined, and a row would round differently in a prefill than alone.
__attribute__((noinline)) void softmax(float* p, int64_t len) {
  const int64_t end = padded(len);
  std::fill(p + len, p + end, -std::numeric_limits<float>::infinity());
  vf tops = vf{} - std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < end; j += kLanes) {
    const vf v = load(p + j);
    tops = v > tops ? v : tops;
  }
  float top = tops[0];
  for (int l = 1; l < kLanes; ++l) top = std::max(top, tops[l]);
  vf totals = {};
  vi lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  for (int64_t j = 0; j < end; j += kLanes) {
    const vf x = load(p + j) - top;
    vf e;
    if (j + kLanes <= len) {
      e = exp_approx(x);
    } else {  // the padding's exponentials are 0: scaled, 1e-38 would turn subnormal (a slow microcode assist)
      const vi pad = lane >= static_cast<int32_t>(len - j);
      e = exp_approx(pad ? vf{} : x);
      e = pad ? vf{} : e;
    }
    store(p + j, e);
    totals += e;
  }
  const float inv = 1.0f / sum(totals);
  for (int64_t j = 0; j < end; j += kLanes) store(p + j, load(p + j) * inv);
}

void check_dtype(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && (t.scalar_type() == torch::kFloat32 || t.scalar_type() == torch::kBFloat16),
              name, " must be a float32 or bfloat16 CPU tensor");
}

void check_rows(const torch::Tensor& t, const char* name) {
  check_dtype(t, name);
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be 2-D with contiguous rows");
}

void check_same(const torch::Tensor& a, const torch::Tensor& b, const char* what) {
  TORCH_CHECK(a.scalar_type() == b.scalar_type(), what, " must all have the same dtype");
}

int64_t grain_rows(int64_t elements_per_row) {
  return std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, elements_per_row));
}

template <typename T>
void rms_norm_rows(const torch::Tensor& x, const c10::optional<torch::Tensor>& residual, const torch::Tensor& weight,
                   float eps, torch::Tensor& h, torch::Tensor& out) {
  const int64_t rows = x.size(0), n = x.size(1);
  const T* w = weight.data_ptr<T>();
  pool::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    std::vector<float> hf(n);
    for (int64_t r = begin; r < end; ++r) {
      const T* xr = x.data_ptr<T>() + r * x.stride(0);
      T* hr = h.data_ptr<T>() + r * h.stride(0);
      if (residual.has_value()) {
        const T* rr = residual->data_ptr<T>() + r * residual->stride(0);
        int64_t i = 0;
        for (; i + kLanes <= n; i += kLanes) {  // the same arithmetic, sixteen lanes at a time
          const vf sum = rounded<T>(load(xr + i) + load(rr + i));
          store(hr + i, sum);
          store(hf.data() + i, sum);
        }
        for (; i < n; ++i) {
          hr[i] = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(rr[i]));
          hf[i] = static_cast<float>(hr[i]);
        }
      } else {
        to_float(hr, hf.data(), n);
      }
      const float inv = 1.0f / std::sqrt(dot(hf.data(), hf.data(), n) / static_cast<float>(n) + eps);
      T* o = out.data_ptr<T>() + r * n;
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) store(o + i, load(w + i) * rounded<T>(load(hf.data() + i) * splat(inv)));
      for (; i < n; ++i) o[i] = static_cast<T>(static_cast<float>(w[i]) * rounded<T>(hf[i] * inv));
    }
  });
}

template <typename T>
void rotary_rows(const int64_t* pos, torch::Tensor& t, const float* cos_sin, int64_t rotary) {
  const int64_t tokens = t.size(0), heads = t.size(1), s0 = t.stride(0), s1 = t.stride(1), half = rotary / 2;
  T* base = t.data_ptr<T>();
  pool::parallel_for(0, tokens, grain_rows(heads * rotary), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const float* c = cos_sin + pos[i] * rotary;
      const float* s = c + half;
      for (int64_t head = 0; head < heads; ++head) {
        T* x = base + i * s0 + head * s1;
        int64_t j = 0;
        for (; j + kLanes <= half; j += kLanes) {  // the same arithmetic, sixteen lanes at a time
          const vf x1 = load(x + j), x2 = load(x + j + half);
          const vf cj = rounded<T>(load(c + j)), sj = rounded<T>(load(s + j));
          store(x + j, rounded<T>(x1 * cj) + rounded<T>(-x2 * sj));
          store(x + j + half, rounded<T>(x2 * cj) + rounded<T>(x1 * sj));
        }
        for (; j < half; ++j) {
          const float x1 = static_cast<float>(x[j]), x2 = static_cast<float>(x[j + half]);
          const float cj = rounded<T>(c[j]), sj = rounded<T>(s[j]);
          x[j] = static_cast<T>(rounded<T>(x1 * cj) + rounded<T>(-x2 * sj));
          x[j + half] = static_cast<T>(rounded<T>(x2 * cj) + rounded<T>(x1 * sj));
        }
      }
    }
  });
}

// Attention may contract a * b + c into one fused multiply-add (its sums are in another order than the
// reference's anyway); the kernels above keep the reference's separate roundings. Its dot products start
// from zero: a * b + c * d could be contracted either way, and which one the compiler picks may differ
// between two loops, so a row attended in a group would not round as it does alone (batch invariance).
#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

// Keys ahead of the one attended whose cache rows are prefetched (a row is every KV head of a position).
constexpr int64_t kPrefetchKeys = 8;

// Every line of the cache row at `p` (`bytes` long) into L1 (`Locality` 3, as __builtin_prefetch takes it) or
// L2 (2): a row of one position holds all its KV heads, so its first head's pass fetches them all, and the
// other heads find them in cache.
template <int Locality = 3>
inline void prefetch_row(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t line = 0; line < bytes; line += 64) __builtin_prefetch(c + line, 0, Locality);
}

// The next query row's context, a share of it fetched into L2 while this (row, KV head) is attended: the
// item of KV head h takes the h-th of the next row's keys (their whole key and value rows), a few with
// each step over its own keys (for heads wider than 64, all of them once its scores are done). Only the
// first head's pass over a row reads it from memory, at the pace of one head's arithmetic, while the other
// heads' passes read nothing; so the next row's context streams in through all of them (attention from
// memory 4-9% faster, docs/perf.md). Empty (count 0) where the next row is not this thread's.
struct NextKeys {
  const char* k = nullptr;  // the caches
  const char* v = nullptr;
  const int32_t* table = nullptr;  // the next row's block table
  int64_t block = 0, row_bytes = 0, first = 0, count = 0;

  // Keys first + from .. first + to - 1 into L2.
  void fetch(int64_t from, int64_t to) const {
    for (int64_t j = first + from; j < first + to; ++j) {
      const int64_t at = (static_cast<int64_t>(table[j / block]) * block + j % block) * row_bytes;
      prefetch_row<2>(k + at, row_bytes);
      prefetch_row<2>(v + at, row_bytes);
    }
  }
};

// The prefetches of one pass over a row's keys (attend_item, attend_group): with `rows_k`/`rows_v` (the caches
// at this head's row starts; null where another head's pass streams them) each key's whole row, `row_bytes`
// long, `kPrefetchKeys` ahead of its scores and its value row with them, so the first head's pass streams the
// context from memory for them all; and the next row's share (`ahead`) spread over the four-key steps.
template <typename T>
struct KeyStream {
  const int64_t* at;
  int64_t len;
  const T* rows_k;
  const T* rows_v;
  int64_t row_bytes;
  const NextKeys& ahead;
  int64_t fetched = 0;

  void start() const {
    if (rows_k == nullptr) return;
    for (int64_t j = 0; j < std::min(len, kPrefetchKeys); ++j) prefetch_row(rows_k + at[j], row_bytes);
  }
  // Before the four keys from j.
  void four(int64_t j) {
    const int64_t due = (j / 4 + 1) * ahead.count / (len / 4);
    ahead.fetch(fetched, due);
    fetched = due;
    if (rows_k == nullptr) return;
    for (int64_t a = j + kPrefetchKeys; a < std::min(len, j + kPrefetchKeys + 4); ++a) {
      prefetch_row(rows_k + at[a], row_bytes);
    }
    for (int64_t a = j; a < j + 4; ++a) prefetch_row(rows_v + at[a], row_bytes);
  }
  // Before key j alone.
  void one(int64_t j) const {
    if (rows_k == nullptr) return;
    if (j + kPrefetchKeys < len) prefetch_row(rows_k + at[j + kPrefetchKeys], row_bytes);
    prefetch_row(rows_v + at[j], row_bytes);
  }
  void finish() { ahead.fetch(fetched, ahead.count); }
};

// A key's or value's row of one KV head: NV vectors.
template <typename T, int NV>
inline void load_row(const T* p, vf (&row)[NV]) {
  for (int c = 0; c < NV; ++c) row[c] = load(p + c * kLanes);
}

// Query head qg's scores against four keys' rows, each a dot product from zero (see the pragma above) folded
// across its lanes, the four folded together. A row's scores come from here and `score_one` whichever kernel
// attends it, so they are the same.
template <int NV>
inline vf4 score_four(const float* qg, const vf (&k)[4][NV]) {
  vf acc[4] = {};
  for (int c = 0; c < NV; ++c) {
    const vf qc = load(qg + c * kLanes);
    for (int u = 0; u < 4; ++u) acc[u] += qc * k[u][c];
  }
  return sum4(acc[0], acc[1], acc[2], acc[3]);
}

// Query head qg's score against one key's row.
template <int NV>
inline float score_one(const float* qg, const vf (&k)[NV]) {
  vf acc = {};
  for (int c = 0; c < NV; ++c) acc += load(qg + c * kLanes) * k[c];
  return sum(acc);
}

// One value row v into G heads' weighted sums, each head's weight `ld` floats after the one before (a plain
// function, not a lambda: #pragma GCC optimize skips lambdas, whose sums would round apart from their products).
template <int G, int NV>
inline void add_value(vf (&acc)[G][NV], const float* weights, int64_t ld, const vf (&v)[NV]) {
  for (int h = 0; h < G; ++h) {
    const vf weight = splat(weights[h * ld]);
    for (int c = 0; c < NV; ++c) acc[h][c] += weight * v[c];
  }
}

// One (query row, KV head) of attention for head_dim = 16 * NV and a group of G query heads (G = 0: any
// group, read at run time): every key row is loaded once for the whole group (its scores), then every
// value row once (the group's weighted sums, in G * NV vector registers where they fit). Key j's row is at
// `at[j]` elements from kc and vc (its KV head's offset included in them). `scores` holds group *
// padded(len) floats. `rows_k`, `rows_v`, `row_bytes` and `ahead`: the prefetches, `KeyStream`.
template <typename T, int NV, int G>
void attend_item(const float* qf, int64_t group, const T* kc, const T* vc, const int64_t* at, int64_t len,
                 float* scores, T* out, int64_t out_head_stride, const T* rows_k, const T* rows_v,
                 int64_t row_bytes, const NextKeys& ahead) {
  constexpr int64_t dim = NV * kLanes;
  const int64_t heads = G > 0 ? G : group, ld = padded(len);
  KeyStream<T> stream{at, len, rows_k, rows_v, row_bytes, ahead};
  stream.start();
  int64_t j = 0;
  if constexpr (NV <= 4) {  // four keys at a time, their sums folded together
    for (; j + 4 <= len; j += 4) {
      stream.four(j);
      vf k[4][NV];
      for (int u = 0; u < 4; ++u) load_row(kc + at[j + u], k[u]);
      for (int64_t g = 0; g < heads; ++g) {
        const vf4 sums = score_four<NV>(qf + g * dim, k);
        std::memcpy(scores + g * ld + j, &sums, sizeof(sums));
      }
    }
  }
  for (; j < len; ++j) {
    stream.one(j);
    vf k[NV];
    load_row(kc + at[j], k);
    for (int64_t g = 0; g < heads; ++g) scores[g * ld + j] = score_one<NV>(qf + g * dim, k);
  }
  stream.finish();
  for (int64_t g = 0; g < heads; ++g) softmax(scores + g * ld, len);
  constexpr int kHeld = G > 0 ? G : 1;  // heads summed at once
  for (int64_t g0 = 0; g0 < heads; g0 += kHeld) {
    vf acc[kHeld][NV] = {};
    for (int64_t j = 0; j < len; ++j) {
      vf v[NV];
      load_row(vc + at[j], v);
      add_value<kHeld, NV>(acc, scores + g0 * ld + j, ld, v);
    }
    for (int h = 0; h < kHeld; ++h) {
      T* o = out + (g0 + h) * out_head_stride;
      for (int c = 0; c < NV; ++c) store(o + c * kLanes, acc[h][c]);
    }
  }
}

// Query rows of a prefill attended together, at most this many.
constexpr int64_t kGroupRows = 4;

// `rows` (2 .. kGroupRows) query rows of one sequence at consecutive positions, one KV head, G query heads of
// head_dim = 16 * NV each: row r attends the first len - rows + 1 + r keys. Each key row is loaded once for all
// of them, each value row once for every pair (or more, as registers allow) of rows; in a long prefill the
// context comes from L3, and reading it once per row was what its attention waited on (docs/perf.md). Every
// row's arithmetic is attend_item's, in its order: its keys four at a time while four fit, the rest one at
// a time, its softmax, its weighted sum in key order; so a row's result does not depend on the rows beside
// it (batch invariance): both kernels take their scores, weighted sums and prefetches from the same
// functions (score_four, score_one, add_value, KeyStream). qf: rows * G * dim floats, scaled; scores:
// rows * G * padded(len); out[r]: row r's first head of this group.
template <typename T, int NV, int G>
void attend_group(const float* qf, int64_t rows, const T* kc, const T* vc, const int64_t* at, int64_t len,
                  float* scores, T* const* out, int64_t out_head_stride, const T* rows_k, const T* rows_v,
                  int64_t row_bytes, const NextKeys& ahead) {
  static_assert(NV <= 4 && G > 0, "four keys' rows and a group's queries must fit in registers");
  constexpr int64_t dim = NV * kLanes;
  constexpr int kPair = std::max(1, std::min<int>(kGroupRows, 24 / (G * NV)));  // rows whose sums share a value
  const int64_t ld = padded(len), shortest = len - rows + 1;
  auto keys = [&](int64_t r) { return shortest + r; };
  KeyStream<T> stream{at, len, rows_k, rows_v, row_bytes, ahead};
  stream.start();
  for (int64_t j = 0; j + 4 <= len; j += 4) {
    stream.four(j);
    vf k[4][NV];
    for (int u = 0; u < 4; ++u) load_row(kc + at[j + u], k[u]);
    for (int64_t r = 0; r < rows; ++r) {
      if (j + 4 > keys(r)) continue;  // this row's last keys go one at a time, below
      for (int g = 0; g < G; ++g) {
        const vf4 sums = score_four<NV>(qf + (r * G + g) * dim, k);
        std::memcpy(scores + (r * G + g) * ld + j, &sums, sizeof(sums));
      }
    }
  }
  stream.finish();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = keys(r) / 4 * 4; j < keys(r); ++j) {
      vf k[NV];
      load_row(kc + at[j], k);
      for (int g = 0; g < G; ++g) scores[(r * G + g) * ld + j] = score_one<NV>(qf + (r * G + g) * dim, k);
    }
    for (int g = 0; g < G; ++g) softmax(scores + (r * G + g) * ld, keys(r));
  }
  for (int64_t r0 = 0; r0 < rows; r0 += kPair) {
    const int64_t pair = std::min<int64_t>(kPair, rows - r0);
    vf acc[kPair][G][NV] = {};
    int64_t j = 0;
    for (; j < keys(r0); ++j) {  // keys every row of the pair attends
      vf v[NV];
      load_row(vc + at[j], v);
      for (int p = 0; p < kPair; ++p) {
        if (p < pair) add_value<G, NV>(acc[p], scores + (r0 + p) * G * ld + j, ld, v);
      }
    }
    for (int p = 1; p < pair; ++p) {  // the later rows' last keys
      for (int64_t i = j; i < keys(r0 + p); ++i) {
        vf v[NV];
        load_row(vc + at[i], v);
        add_value<G, NV>(acc[p], scores + (r0 + p) * G * ld + i, ld, v);
      }
    }
    for (int p = 0; p < pair; ++p) {
      for (int h = 0; h < G; ++h) {
        T* o = out[r0 + p] + h * out_head_stride;
        for (int c = 0; c < NV; ++c) store(o + c * kLanes, acc[p][h][c]);
      }
    }
  }
}

#pragma GCC pop_options

template <typename T>
using AttendItem = void (*)(const float*, int64_t, const T*, const T*, const int64_t*, int64_t, float*, T*,
                            int64_t, const T*, const T*, int64_t, const NextKeys&);

template <typename T, int NV>
AttendItem<T> for_group(int64_t group) {
  switch (group) {
    case 1: return &attend_item<T, NV, 1>;
    case 2: return &attend_item<T, NV, 2>;
    case 3: return &attend_item<T, NV, 3>;
    case 4: return &attend_item<T, NV, 4>;
    case 6: return &attend_item<T, NV, 6>;
    case 8: return &attend_item<T, NV, 8>;
    default: return &attend_item<T, NV, 0>;
  }
}

// The vector kernel for a head size and group, or nullptr (the scalar loop serves).
template <typename T>
AttendItem<T> vector_attention(int64_t dim, int64_t group) {
  switch (dim) {
    case 32: return for_group<T, 2>(group);
    case 64: return for_group<T, 4>(group);
    case 80: return &attend_item<T, 5, 0>;
    case 96: return &attend_item<T, 6, 0>;
    case 128: return for_group<T, 8>(group);
    default: return nullptr;
  }
}

template <typename T>
using GroupItem = void (*)(const float*, int64_t, const T*, const T*, const int64_t*, int64_t, float*, T* const*,
                           int64_t, const T*, const T*, int64_t, const NextKeys&);

template <typename T, int NV>
GroupItem<T> group_for(int64_t group) {
  switch (group) {
    case 1: return &attend_group<T, NV, 1>;
    case 2: return &attend_group<T, NV, 2>;
    case 3: return &attend_group<T, NV, 3>;
    case 4: return &attend_group<T, NV, 4>;
    default: return nullptr;
  }
}

// The kernel attending a prefill's rows kGroupRows at a time for a head size and group, or nullptr (one at a
// time, as decode rows are).
template <typename T>
GroupItem<T> group_attention(int64_t dim, int64_t group) {
  switch (dim) {
    case 32: return group_for<T, 2>(group);
    case 64: return group_for<T, 4>(group);
    default: return nullptr;
  }
}

#pragma GCC push_options
#pragma GCC optimize("fp-contract=fast")

// float32 y[m, n:n+4] = x[m] . w[n:n+4] (+ bias) for MR rows of x, K a multiple of 16: every output a
// dot product in 16 lanes, folded at the end. The four weight rows are read once for all MR rows (then
// from L1), while the tile prefetches `lines` cache lines from `prefetch` into L2, spread over its loop:
// each tile of a block takes its share of the next block, so memory streams while the block multiplies.
template <int MR>
void dot_tile(const float* __restrict__ x, int64_t ldx, const float* __restrict__ w, int64_t K, float* __restrict__ y,
              int64_t ldy, const float* bias, const char* prefetch, int64_t lines) {
  vf acc[MR][4] = {};
  const int64_t steps = K / kLanes;
  int64_t issued = 0;
  for (int64_t k = 0, step = 1; k < K; k += kLanes, ++step) {
    for (const int64_t due = step * lines / steps; issued < due; ++issued) {
      __builtin_prefetch(prefetch + issued * 64, 0, 2);
    }
    vf wv[4];
    for (int n = 0; n < 4; ++n) wv[n] = load(w + n * K + k);
    for (int m = 0; m < MR; ++m) {
      vf xv = load(x + m * ldx + k);
      asm("" : "+v"(xv));  // one load for the four products: GCC would fold it into each of them
      for (int n = 0; n < 4; ++n) acc[m][n] += xv * wv[n];
    }
  }
  for (int m = 0; m < MR; ++m) {
    vf4 out = sum4(acc[m][0], acc[m][1], acc[m][2], acc[m][3]);
    if (bias != nullptr) {
      vf4 b;
      std::memcpy(&b, bias, sizeof(b));
      out += b;
    }
    std::memcpy(y + m * ldy, &out, sizeof(out));
  }
}

#pragma GCC pop_options

constexpr int kTileRows = 6;
using DotTile = void (*)(const float*, int64_t, const float*, int64_t, float*, int64_t, const float*, const char*,
                         int64_t);
const DotTile kDotTiles[kTileRows] = {&dot_tile<1>, &dot_tile<2>, &dot_tile<3>,
                                       &dot_tile<4>, &dot_tile<5>, &dot_tile<6>};

// silu(gate) * up for sixteen lanes: silu rounded to T first, as F.silu's output is.
template <typename T>
inline void silu_mul_lanes(const T* gate, const T* up, T* dst) {
  const vf x = load(gate);
  store(dst, rounded<T>(x / (1.0f + exp_approx(-x))) * load(up));
}

// silu(gate) * up, row by row, sixteen lanes at a time.
template <typename T>
void silu_mul_rows(const torch::Tensor& gate_up, torch::Tensor& out) {
  const int64_t rows = gate_up.size(0), n = out.size(1), ld = gate_up.stride(0);
  const T* in = gate_up.data_ptr<T>();
  T* o = out.data_ptr<T>();
  pool::parallel_for(0, rows, grain_rows(2 * n), [&](int64_t begin, int64_t end) {
    alignas(64) T gate_tail[kLanes], up_tail[kLanes], out_tail[kLanes];
    auto lanes = &silu_mul_lanes<T>;
    for (int64_t r = begin; r < end; ++r) {
      const T* gate = in + r * ld;
      const T* up = gate + n;
      T* dst = o + r * n;
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes) lanes(gate + i, up + i, dst + i);
      if (i < n) {  // the last lanes through a padded copy
        std::fill(gate_tail, gate_tail + kLanes, T(0.0f));
        std::fill(up_tail, up_tail + kLanes, T(0.0f));
        std::copy(gate + i, gate + n, gate_tail);
        std::copy(up + i, up + n, up_tail);
        lanes(gate_tail, up_tail, out_tail);
        std::copy(out_tail, out_tail + (n - i), dst + i);
      }
    }
  });
}

// A query row of q and the context it attends: the first len keys of sequence seq. With count > 1, the rows
// row .. row + count - 1 of one prefill, the last of which attends len keys (each the one before it and one more).
struct QueryRow {
  int64_t row, seq, len, count = 1;
};

// Rows of one sequence at consecutive positions merged, up to kGroupRows at a time.
std::vector<QueryRow> grouped(const std::vector<QueryRow>& rows) {
  std::vector<QueryRow> groups;
  for (const QueryRow& r : rows) {
    QueryRow* last = groups.empty() ? nullptr : &groups.back();
    if (last != nullptr && last->count < kGroupRows && last->seq == r.seq && last->row + last->count == r.row &&
        last->len + 1 == r.len) {
      ++last->count;
      last->len = r.len;
    } else {
      groups.push_back(r);
    }
  }
  return groups;
}

// Attention of each query row over its paged context, one (row, KV head) at a time, or a prefill's rows a few
// at a time where `group_attention` has a kernel for them; see paged_attention_. A thread takes consecutive
// items, so a row's KV heads mostly run on one thread, one after another: the first streams the row's context
// from memory (its whole cache rows, prefetched), the others read it from cache; meanwhile each fetches its
// share of the next row's context into L2 (`NextKeys`).
template <typename T>
void attend_rows(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                 const torch::Tensor& block_tables, const std::vector<QueryRow>& each_row, float scale,
                 torch::Tensor& out) {
  const int64_t heads = q.size(1), dim = q.size(2);
  const int64_t block = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  const int64_t max_blocks = block_tables.size(1), row = kv_heads * dim;
  const int64_t row_bytes = row * static_cast<int64_t>(sizeof(T));
  const T* kc = k_cache.data_ptr<T>();
  const T* vc = v_cache.data_ptr<T>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const T* qp = q.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), os0 = out.stride(0), os1 = out.stride(1);
  const bool heads_packed = q.stride(1) == dim && out.stride(1) == dim;
  const AttendItem<T> vector_item = heads_packed ? vector_attention<T>(dim, group) : nullptr;
  const GroupItem<T> group_item = heads_packed ? group_attention<T>(dim, group) : nullptr;
  const std::vector<QueryRow> rows = group_item != nullptr ? grouped(each_row) : each_row;
  const int64_t items = static_cast<int64_t>(rows.size()) * kv_heads;
  pool::parallel_for(0, items, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores, qf(kGroupRows * group * dim), acc(group * dim), kv_row(dim);
    std::vector<int64_t> at;  // where each key's row starts in the caches, for the current query row
    int64_t current = -1;
    for (int64_t item = begin; item < end; ++item) {
      const QueryRow& query = rows[item / kv_heads];
      const int64_t kvh = item % kv_heads, len = query.len, qrow = query.row;
      const bool first = item / kv_heads != current;
      if (first) {
        current = item / kv_heads;
        const int32_t* table = tables + query.seq * max_blocks;
        at.resize(len);
        for (int64_t b = 0, j = 0; j < len; ++b) {
          const int64_t start = static_cast<int64_t>(table[b]) * block * row;
          for (int64_t t = 0; t < block && j < len; ++t, ++j) at[j] = start + t * row;
        }
      }
      const int64_t count = query.count, ld = padded(len);
      for (int64_t r = 0; r < count; ++r) {
        for (int64_t g = 0; g < group; ++g) {
          to_float(qp + (qrow + r) * qs0 + (kvh * group + g) * qs1, qf.data() + (r * group + g) * dim, dim);
        }
      }
      scores.resize(count * group * ld);
      if (vector_item != nullptr) {
        for (int64_t i = 0; i < count * group * dim; ++i) qf[i] *= scale;
        NextKeys ahead;
        if ((item / kv_heads + 1) * kv_heads < end) {
          const QueryRow& next = rows[item / kv_heads + 1];
          const int64_t first = kvh * next.len / kv_heads, after = (kvh + 1) * next.len / kv_heads;
          ahead = NextKeys{reinterpret_cast<const char*>(kc), reinterpret_cast<const char*>(vc),
                           tables + next.seq * max_blocks, block, row_bytes, first, after - first};
        }
        if (count > 1) {
          T* outs[kGroupRows];
          for (int64_t r = 0; r < count; ++r) outs[r] = op + (qrow + r) * os0 + kvh * group * os1;
          group_item(qf.data(), count, kc + kvh * dim, vc + kvh * dim, at.data(), len, scores.data(), outs, os1,
                     first ? kc : nullptr, first ? vc : nullptr, row_bytes, ahead);
        } else {
          vector_item(qf.data(), group, kc + kvh * dim, vc + kvh * dim, at.data(), len, scores.data(),
                      op + qrow * os0 + kvh * group * os1, os1, first ? kc : nullptr, first ? vc : nullptr,
                      row_bytes, ahead);
        }
        continue;
      }
      // Row j of a cache for this sequence and KV head, as floats (bfloat16 rows converted into kv_row).
      auto cached = [&](const T* cache, int64_t j) -> const float* {
        const T* p = cache + at[j] + kvh * dim;
        if constexpr (std::is_same_v<T, float>) {
          return p;
        } else {
          to_float(p, kv_row.data(), dim);
          return kv_row.data();
        }
      };
      for (int64_t j = 0; j < len; ++j) {
        const float* kf = cached(kc, j);
        for (int64_t g = 0; g < group; ++g) scores[g * ld + j] = dot(qf.data() + g * dim, kf, dim) * scale;
      }
      for (int64_t g = 0; g < group; ++g) softmax(scores.data() + g * ld, len);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        const float* vf = cached(vc, j);
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * ld + j];
          float* __restrict__ a = acc.data() + g * dim;
#pragma omp simd
          for (int64_t d = 0; d < dim; ++d) a[d] += p * vf[d];
        }
      }
      for (int64_t g = 0; g < group; ++g) {
        T* o = op + qrow * os0 + (kvh * group + g) * os1;
        for (int64_t d = 0; d < dim; ++d) o[d] = static_cast<T>(acc[g * dim + d]);
      }
    }
  });
}

}  // namespace

// weight * (h * rsqrt(mean(h^2) + eps)) with h = x (+ residual); returns {normed, h}.
std::vector<torch::Tensor> rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor weight,
                                    double eps) {
  RECORD_FUNCTION("mcpmux::rms_norm", {});  // shown by torch.profiler
  check_rows(x, "x");
  check_same(x, weight, "x and weight");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n, "weight must hold one contiguous value per column");
  if (residual.has_value()) {
    check_rows(*residual, "residual");
    check_same(x, *residual, "x and residual");
  }
  auto h = residual.has_value() ? torch::empty({rows, n}, x.options()) : x;
  auto out = torch::empty({rows, n}, x.options());
  if (x.scalar_type() == torch::kFloat32) {
    rms_norm_rows<float>(x, residual, weight, static_cast<float>(eps), h, out);
  } else {
    rms_norm_rows<BFloat16>(x, residual, weight, static_cast<float>(eps), h, out);
  }
  return {out, h};
}

// NeoX rotary embedding of the first rotary_dim features of every head of q and k, in place.
void rotary_(torch::Tensor positions, torch::Tensor q, torch::Tensor k, torch::Tensor cos_sin) {
  RECORD_FUNCTION("mcpmux::rotary", {});
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous(), "positions must be int64");
  TORCH_CHECK(cos_sin.scalar_type() == torch::kFloat32 && cos_sin.is_contiguous(), "cos_sin must be float32");
  const int64_t tokens = q.size(0), rotary = cos_sin.size(1);
  check_same(q, k, "q and k");
  for (const torch::Tensor* t : {&q, &k}) {
    check_dtype(*t, "q and k");
    TORCH_CHECK(t->dim() == 3 && t->stride(2) == 1, "q and k must be [T, H, D] with contiguous heads");
    TORCH_CHECK(t->size(0) == tokens && t->size(2) >= rotary, "q and k must have a row per position");
  }
  for (torch::Tensor* t : {&q, &k}) {
    if (t->scalar_type() == torch::kFloat32) {
      rotary_rows<float>(positions.data_ptr<int64_t>(), *t, cos_sin.data_ptr<float>(), rotary);
    } else {
      rotary_rows<BFloat16>(positions.data_ptr<int64_t>(), *t, cos_sin.data_ptr<float>(), rotary);
    }
  }
}

// Scatter key/value [T, Hkv, D] (heads contiguous within a row) into the paged caches at slot_mapping
// (block * block_size + offset; negative: skip), in place.
void write_kv_(torch::Tensor key, torch::Tensor value, torch::Tensor k_cache, torch::Tensor v_cache,
               torch::Tensor slot_mapping) {
  RECORD_FUNCTION("mcpmux::write_kv", {});
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(), "slots must be int64");
  const int64_t row = k_cache.size(2) * k_cache.size(3), slots = k_cache.size(0) * k_cache.size(1);
  for (const torch::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->scalar_type() == k_cache.scalar_type() && t->stride(2) == 1 && t->stride(1) == t->size(2) &&
                    t->size(1) * t->size(2) == row,
                "key and value must be [T, Hkv, D] in the cache's dtype, each row contiguous");
  }
  for (const torch::Tensor* t : {&k_cache, &v_cache}) {
    check_dtype(*t, "the caches");
    TORCH_CHECK(t->scalar_type() == k_cache.scalar_type() && t->is_contiguous(), "the caches must be contiguous");
  }
  const int64_t bytes = row * k_cache.element_size();
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  char* kc = static_cast<char*>(k_cache.data_ptr());
  char* vc = static_cast<char*>(v_cache.data_ptr());
  const char* kp = static_cast<const char*>(key.data_ptr());
  const char* vp = static_cast<const char*>(value.data_ptr());
  const int64_t ks = key.stride(0) * key.element_size(), vs = value.stride(0) * value.element_size();
  for (int64_t i = 0; i < key.size(0); ++i) {
    TORCH_CHECK(slot[i] < slots, "slot ", slot[i], " is outside the cache");
  }
  pool::parallel_for(0, key.size(0), grain_rows(2 * row), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      if (slot[i] < 0) continue;
      std::memcpy(kc + slot[i] * bytes, kp + i * ks, bytes);
      std::memcpy(vc + slot[i] * bytes, vp + i * vs, bytes);
    }
  });
}

// Causal attention of a step's query rows over their paged contexts, read in place through the block
// tables: scores, softmax, weighted sum of values, written to each row of out. It attends every row of a
// single-token sequence (a decode row) and every row of a sequence with several query tokens whose
// q_len * seq_len is at most max_pairs (a short prefill or extend: row i of q_len sits at position
// seq_len - q_len + i and sees the keys up to it); the rows of longer ones are left alone (the caller
// attends them). q, out: [T, H, D]; caches: [blocks, block_size, Hkv, D]; block_tables: [S, max_blocks]
// int32; seq_lens: [S] int32, context lengths including this step's tokens; query_start_loc: [S + 1] int32.
void paged_attention_(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor block_tables,
                      torch::Tensor seq_lens, torch::Tensor query_start_loc, double scale, int64_t max_pairs,
                      torch::Tensor out) {
  RECORD_FUNCTION("mcpmux::paged_attention", {});
  check_dtype(q, "q");
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "q must be [T, H, D] with contiguous heads");
  TORCH_CHECK(out.sizes() == q.sizes() && out.stride(2) == 1, "out must be shaped like q");
  for (const torch::Tensor* t : {&k_cache, &v_cache, &out}) check_same(q, *t, "q, the caches and out");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous(), "the caches must be contiguous");
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(), "block tables: int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(), "seq_lens: int32");
  TORCH_CHECK(query_start_loc.scalar_type() == torch::kInt32 && query_start_loc.is_contiguous(),
              "query_start_loc: int32");
  const int64_t num_seqs = seq_lens.size(0), capacity = block_tables.size(1) * k_cache.size(1);
  TORCH_CHECK(block_tables.size(0) == num_seqs && query_start_loc.size(0) == num_seqs + 1, "one table per sequence");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0, "query heads must be a multiple of KV heads");
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const int32_t* starts = query_start_loc.data_ptr<int32_t>();
  TORCH_CHECK(starts[num_seqs] <= q.size(0), "query_start_loc points past q");
  std::vector<QueryRow> rows;
  for (int64_t s = 0; s < num_seqs; ++s) {
    const int64_t q_len = starts[s + 1] - starts[s], len = lens[s];
    if (q_len > 1 && q_len * len > max_pairs) continue;
    TORCH_CHECK(q_len >= 1 && len >= q_len && len <= capacity, "sequence ", s,
                " has a context its block table cannot hold");
    for (int64_t i = 0; i < q_len; ++i) rows.push_back({starts[s] + i, s, len - q_len + i + 1});
  }
  if (q.scalar_type() == torch::kFloat32) {
    attend_rows<float>(q, k_cache, v_cache, block_tables, rows, static_cast<float>(scale), out);
  } else {
    attend_rows<BFloat16>(q, k_cache, v_cache, block_tables, rows, static_cast<float>(scale), out);
  }
}

// silu(gate) * up for gate_up = [gate | up] along the last dimension, in one pass.
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  RECORD_FUNCTION("mcpmux::silu_and_mul", {});
  check_rows(gate_up, "gate_up");
  TORCH_CHECK(gate_up.size(1) % 2 == 0, "gate_up must hold [gate | up]");
  auto out = torch::empty({gate_up.size(0), gate_up.size(1) / 2}, gate_up.options());
  if (gate_up.scalar_type() == torch::kFloat32) {
    silu_mul_rows<float>(gate_up, out);
  } else {
    silu_mul_rows<BFloat16>(gate_up, out);
  }
  return out;
}

// F.linear(x, weight, bias) in float32 for the few rows of a decode step, on the plain [N, K] weight:
// K a multiple of 16 and N of 4 (the caller checks, see `dot_linear_fits`).
torch::Tensor dot_linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias) {
  RECORD_FUNCTION("mcpmux::dot_linear", {});
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32, "float32 only");
  TORCH_CHECK(x.dim() == 2 && x.stride(1) == 1 && weight.dim() == 2 && weight.is_contiguous(),
              "x must be 2-D with contiguous rows, the weight contiguous [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(weight.size(1) == K && K % kLanes == 0 && N % 4 == 0, "needs K % 16 == 0 and N % 4 == 0");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->is_contiguous() && bias->numel() == N, "bias: [N]");
    b = bias->data_ptr<float>();
  }
  auto y = torch::empty({M, N}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int64_t ldx = x.stride(0), block_lines = 4 * K * 4 / 64, tiles = (M + kTileRows - 1) / kTileRows;
  pool::parallel_for(0, N / 4, 8, [&](int64_t begin, int64_t end) {
    for (int64_t block = begin; block < end; ++block) {
      const float* w = wp + block * 4 * K;
      const char* next = reinterpret_cast<const char*>(w + 4 * K);
      for (int64_t m = 0, tile = 0; m < M; m += kTileRows, ++tile) {
        const int64_t rows = std::min<int64_t>(kTileRows, M - m);
        // This tile's share of the next block of this thread's range (none after its last block).
        const int64_t first = tile * block_lines / tiles;
        const int64_t lines = block + 1 < end ? (tile + 1) * block_lines / tiles - first : 0;
        kDotTiles[rows - 1](xp + m * ldx, ldx, w, K, yp + m * N + block * 4, N, b == nullptr ? nullptr : b + block * 4,
                            next + first * 64, lines);
      }
    }
  });
  return y;
}

bool dot_linear_fits(const torch::Tensor& x, const torch::Tensor& weight, int64_t max_rows) {
  return !weight.is_mkldnn() && x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 &&
         x.dim() == 2 && x.size(0) <= max_rows && weight.dim() == 2 && weight.size(1) % kLanes == 0 &&
         weight.size(0) % 4 == 0;
}

// F.linear(x, weight, bias) in float32 for the many rows of a prefill step, on the plain [N, K] weight: the
// output's columns split into blocks that the pool's threads take, each block one single-threaded MKL product
// of every row of x with that block's weight rows. MKL's own team ends each product at an OpenMP barrier: on a
// host where other processes take a core now and then, every product waits for the thread whose core was taken
// (a 512-token prefill step took 1.9x as long as on the pool, docs/perf.md), and the thread governor shrinks
// that team when the load stays. So the pool multiplies where it has more threads than torch's team, and for
// products of kPoolGemmRows rows or more (a full prefill step): on a quiet host each product alone is 8-25%
// slower in blocks than on MKL's team, but such a step as a whole was no slower; smaller products on a quiet
// host stay on MKL's team.
constexpr int64_t kPoolGemmRows = 512;

bool pool_gemm_fits(const torch::Tensor& x, const torch::Tensor& weight) {
  const int mode = pool::mode.load(std::memory_order_relaxed);
  if (mode <= 0 || (mode <= at::get_num_threads() && x.size(0) < kPoolGemmRows)) return false;
  return sgemm_ != nullptr && MKL_Set_Num_Threads_Local != nullptr && !weight.is_mkldnn() &&
         x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32 && x.dim() == 2 &&
         weight.dim() == 2 && weight.is_contiguous() && x.size(1) == weight.size(1) &&
         x.size(0) <= std::numeric_limits<int>::max() && weight.numel() <= std::numeric_limits<int>::max();
}

torch::Tensor pool_gemm(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias) {
  RECORD_FUNCTION("mcpmux::pool_gemm", {});
  if (x.stride(1) != 1 || x.stride(0) < x.size(1)) x = x.contiguous();
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  auto y = torch::empty({M, N}, x.options());
  float beta = 0.0f;
  if (bias.has_value()) {  // added as addmm adds it: the product summed into a copy of the bias in each row
    TORCH_CHECK(bias->scalar_type() == torch::kFloat32 && bias->numel() == N, "bias: [N] float32");
    y.copy_(bias->reshape({1, N}).expand({M, N}));
    beta = 1.0f;
  }
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  const int ldx = static_cast<int>(x.stride(0)), ldw = static_cast<int>(K), ldy = static_cast<int>(N);
  const int m = static_cast<int>(M), k = static_cast<int>(K);
  // Blocks of kGemmColumns output columns; a chunk at least kGemmMinColumns wide keeps each product efficient.
  constexpr int64_t kGemmColumns = 16, kGemmMinColumns = 64;
  const int64_t blocks = (N + kGemmColumns - 1) / kGemmColumns;
  pool::parallel_for(0, blocks, kGemmMinColumns / kGemmColumns, [&](int64_t begin, int64_t end) {
    const int64_t first = begin * kGemmColumns, last = std::min(N, end * kGemmColumns);
    const int n = static_cast<int>(last - first);
    const float alpha = 1.0f;
    const int before = MKL_Set_Num_Threads_Local(1);
    // Column-major view: y^T[first:last, :] = W[first:last, :] (K x n, transposed) times x^T (K x M).
    sgemm_("T", "N", &n, &m, &k, &alpha, wp + first * K, &ldw, xp, &ldx, &beta, yp + first, &ldy);
    MKL_Set_Num_Threads_Local(before);
  });
  return y;
}

// oneDNN's product (mkldnn::_linear_pointwise), on a oneDNN weight or a plain one.
static torch::Tensor onednn_linear(const torch::Tensor& x, const torch::Tensor& weight,
                                   const c10::optional<torch::Tensor>& bias) {
  static const auto onednn =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const c10::optional<torch::Tensor>&,
                               c10::string_view, c10::List<c10::optional<c10::Scalar>>,
                               c10::optional<c10::string_view>)>();
  return onednn.call(x.contiguous(), weight, bias, "none", c10::List<c10::optional<c10::Scalar>>(), c10::nullopt);
}

// Whether float32 products past the dot kernel's rows run on oneDNN instead of MKL (`set_onednn_rows`, which
// cpu_fused sets where oneDNN is much the faster: MKL takes its AVX2 path on AMD CPUs with AVX-512).
static std::atomic<bool> onednn_rows{false};

void set_onednn_rows(bool on) { onednn_rows.store(on, std::memory_order_relaxed); }

// A product as the model's `linear` runs it where these kernels are built (models/linear.py): the packed product
// for a packed weight (cpu_amx_source), oneDNN for a oneDNN weight, the dot kernel for up to max_rows float32
// rows, else oneDNN where set_onednn_rows chose it, else MKL (on the pool's blocks or through ATen's linear).
torch::Tensor linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias, int64_t max_rows) {
  if (amx::is_packed(weight)) return amx::linear(x, weight, bias);
  if (weight.is_mkldnn()) return onednn_linear(x, weight, bias);
  if (dot_linear_fits(x, weight, max_rows)) return dot_linear(x.stride(1) == 1 ? x : x.contiguous(), weight, bias);
  if (onednn_rows.load(std::memory_order_relaxed) && x.scalar_type() == torch::kFloat32 &&
      weight.scalar_type() == torch::kFloat32 && weight.dim() == 2) {
    return onednn_linear(x, weight, bias);
  }
  if (pool_gemm_fits(x, weight)) return pool_gemm(x, weight, bias);
  return at::linear(x, weight, bias);
}

// linear(x, weight) as float32 logits (the output head): for a packed weight widened as the product rounds them,
// in one pass, else widened after.
torch::Tensor logits(torch::Tensor x, torch::Tensor weight, int64_t max_rows) {
  if (amx::is_packed(weight) && amx::runs_packed(x, weight)) return amx::linear(x, weight, {}, true);
  return linear(x, weight, {}, max_rows).to(torch::kFloat32);
}

// silu_and_mul(linear(x, gate_up, bias)), bit for bit: for a packed weight in one pass (amx::gated_linear: the
// [M, 2I] product is never written out), else in two calls.
torch::Tensor swiglu(torch::Tensor x, torch::Tensor gate_up, c10::optional<torch::Tensor> bias, int64_t max_rows) {
  if (amx::is_packed(gate_up) && gate_up.size(0) % 2 == 0 && amx::runs_packed(x, gate_up)) {
    return amx::gated_linear(x, gate_up, bias, [](const auto* gate, const auto* up, auto* out) {
      silu_mul_lanes(gate, up, out);
      silu_mul_lanes(gate + kLanes, up + kLanes, out + kLanes);
    });
  }
  return silu_and_mul(linear(x, gate_up, bias, max_rows));
}

// The decoder layers of a Llama-family model (pre-RMSNorm, rotary attention with grouped KV heads, SwiGLU
// MLP) in one call, with the kernels above in the order and form LlamaCausalLM's layers call them, so the
// result is theirs bit for bit. For steps whose every sequence paged_attention_ attends (decode rows, and
// prefills with q_len * seq_len <= max_pairs): the caller checks.
class Decoder {
 public:
  // weights: per layer [input_norm, qkv, qkv_bias, o, o_bias, post_norm, gate_up, gate_up_bias, down,
  // down_bias], the biases None where the model has none.
  Decoder(std::vector<std::vector<c10::optional<torch::Tensor>>> weights, int64_t heads, int64_t kv_heads,
          int64_t head_dim, double eps, double scale, int64_t max_rows, int64_t max_pairs)
      : weights_(std::move(weights)), heads_(heads), kv_heads_(kv_heads), head_dim_(head_dim), eps_(eps),
        scale_(scale), max_rows_(max_rows), max_pairs_(max_pairs) {
    for (const auto& layer : weights_) {
      TORCH_CHECK(layer.size() == 10, "ten weights per layer");
      for (int i : {0, 1, 3, 5, 6, 8}) TORCH_CHECK(layer[i].has_value(), "weight ", i, " of a layer is missing");
    }
  }

  // Returns {block output of the last layer, residual stream}; their sum is the final norm's input.
  std::vector<torch::Tensor> run(torch::Tensor hidden, std::vector<torch::Tensor> k_caches,
                                    std::vector<torch::Tensor> v_caches, torch::Tensor positions,
                                    torch::Tensor slot_mapping, torch::Tensor block_tables, torch::Tensor seq_lens,
                                    torch::Tensor query_start_loc, torch::Tensor cos_sin) const {
    TORCH_CHECK(k_caches.size() == weights_.size() && v_caches.size() == weights_.size(), "one cache per layer");
    const int64_t q_size = heads_ * head_dim_, kv_size = kv_heads_ * head_dim_;
    c10::optional<torch::Tensor> residual;
    for (size_t i = 0; i < weights_.size(); ++i) {
      const auto& w = weights_[i];
      auto normed = rms_norm(hidden, residual, *w[0], eps_);
      residual = normed[1];
      const auto qkv = linear(normed[0], *w[1], w[2], max_rows_);
      const int64_t tokens = qkv.size(0);
      auto q = qkv.narrow(1, 0, q_size).view({tokens, heads_, head_dim_});
      auto k = qkv.narrow(1, q_size, kv_size).view({tokens, kv_heads_, head_dim_});
      auto v = qkv.narrow(1, q_size + kv_size, kv_size).view({tokens, kv_heads_, head_dim_});
      rotary_(positions, q, k, cos_sin);
      write_kv_(k, v, k_caches[i], v_caches[i], slot_mapping);
      auto attended = torch::empty_like(q);
      paged_attention_(q, k_caches[i], v_caches[i], block_tables, seq_lens, query_start_loc, scale_, max_pairs_,
                       attended);
      const auto o = linear(attended.view({tokens, q_size}), *w[3], w[4], max_rows_);
      normed = rms_norm(o, residual, *w[5], eps_);
      residual = normed[1];
      hidden = linear(swiglu(normed[0], *w[6], w[7], max_rows_), *w[8], w[9], max_rows_);
    }
    TORCH_CHECK(residual.has_value(), "a decoder needs at least one layer");
    return {hidden, *residual};
  }

 private:
  std::vector<std::vector<c10::optional<torch::Tensor>>> weights_;
  int64_t heads_, kv_heads_, head_dim_;
  double eps_, scale_;
  int64_t max_rows_, max_pairs_;
};

// Bit l set where lane l of v is above s.
inline uint32_t lanes_above(vf v, float s) {
#ifdef __AVX512F__
  return _mm512_cmp_ps_mask((__m512)v, _mm512_set1_ps(s), _CMP_GT_OQ);
#else
  uint32_t bits = 0;
  for (int l = 0; l < kLanes; ++l) bits |= static_cast<uint32_t>(v[l] > s) << l;
  return bits;
#endif
}

// The k largest values of each row of float32 `values` [N, V] and their indices, largest first, equal values
// in the order of their indices (a NaN ranks below every number): torch.topk's values, in one pass over the
// row instead of its partial sort (2.8-6.7 ms for 32 rows of 49,152 at k = 1-256 on one thread here). Every
// value above the k-th largest kept so far is kept; at 2k kept, the best k stay and the k-th is the new floor,
// so after the first few thousand values hardly any lane passes it.
std::vector<torch::Tensor> top_k_rows(torch::Tensor values, int64_t k) {
  RECORD_FUNCTION("mcpmux::top_k", {});
  TORCH_CHECK(values.scalar_type() == torch::kFloat32 && values.dim() == 2 && values.stride(1) == 1,
              "values must be float32 [N, V] with contiguous rows");
  const int64_t rows = values.size(0), n = values.size(1);
  TORCH_CHECK(k >= 1 && k <= n, "k must be between 1 and the row's length, got ", k);
  auto top = torch::empty({rows, k}, values.options());
  auto where = torch::empty({rows, k}, values.options().dtype(torch::kInt64));
  pool::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    using Kept = std::pair<float, int64_t>;  // a NaN kept as -inf, so that it ranks below every number
    const auto rank = [](const Kept& a, const Kept& b) {
      return a.first > b.first || (a.first == b.first && a.second < b.second);
    };
    std::vector<Kept> kept;
    kept.reserve(2 * k + kLanes);
    for (int64_t r = begin; r < end; ++r) {
      const float* p = values.data_ptr<float>() + r * values.stride(0);
      kept.clear();
      for (int64_t i = 0; i < k; ++i) {
        kept.emplace_back(p[i] != p[i] ? -std::numeric_limits<float>::infinity() : p[i], i);
      }
      float floor = 0.0f;
      const auto shrink = [&] {
        std::nth_element(kept.begin(), kept.begin() + (k - 1), kept.end(), rank);
        kept.resize(k);
        floor = kept[k - 1].first;  // a later value must be above it: an equal one has a higher index
      };
      shrink();
      int64_t i = k;
      for (; i + kLanes <= n; i += kLanes) {
        const vf v = load(p + i);
        for (uint32_t above = lanes_above(v, floor); above != 0; above &= above - 1) {
          const int lane = __builtin_ctz(above);
          kept.emplace_back(v[lane], i + lane);
        }
        if (static_cast<int64_t>(kept.size()) >= 2 * k) shrink();
      }
      for (; i < n; ++i) {
        if (p[i] > floor) kept.emplace_back(p[i], i);
      }
      std::partial_sort(kept.begin(), kept.begin() + k, kept.end(), rank);
      float* t = top.data_ptr<float>() + r * k;
      int64_t* w = where.data_ptr<int64_t>() + r * k;
      for (int64_t j = 0; j < k; ++j) {
        t[j] = kept[j].first;
        w[j] = kept[j].second;
      }
    }
  });
  return {top, where};
}

// A token for each of `rows` of float32 `logits` [N, V], drawn from softmax(logits[row] / temperature) by the
// row's uniform number in [0, 1): the first token whose running sum of exp(x / t - max), summed in float64,
// passes draw * their total. A token of probability 0 (a logit of -inf) never comes out; the draw depends on
// that row alone. One pass for the exponentials (kept in a buffer the row's thread owns), one for the total,
// part of one for the search: softmax, a float64 running sum and a search over the vocabulary, fused.
torch::Tensor sample_rows(torch::Tensor logits, torch::Tensor rows, torch::Tensor temperatures, torch::Tensor draws) {
  RECORD_FUNCTION("mcpmux::sample", {});
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be float32 [N, V] with contiguous rows");
  const int64_t count = rows.numel(), n = logits.size(1);
  TORCH_CHECK(rows.scalar_type() == torch::kInt64 && rows.is_contiguous(), "rows: int64");
  TORCH_CHECK(temperatures.scalar_type() == torch::kFloat32 && temperatures.is_contiguous() &&
                  temperatures.numel() == count, "temperatures: float32, one a row");
  TORCH_CHECK(draws.scalar_type() == torch::kFloat64 && draws.is_contiguous() && draws.numel() == count,
              "draws: float64, one a row");
  const int64_t* row = rows.data_ptr<int64_t>();
  for (int64_t i = 0; i < count; ++i) {
    TORCH_CHECK(row[i] >= 0 && row[i] < logits.size(0), "row ", row[i], " is outside the logits");
  }
  auto out = torch::empty({count}, rows.options());
  int64_t* o = out.data_ptr<int64_t>();
  const float* temps = temperatures.data_ptr<float>();
  const double* u = draws.data_ptr<double>();
  pool::parallel_for(0, count, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> e(padded(n));
    for (int64_t i = begin; i < end; ++i) {
      const float* p = logits.data_ptr<float>() + row[i] * logits.stride(0);
      const float inv = 1.0f / temps[i];
      vf tops = splat(-std::numeric_limits<float>::infinity());
      int64_t j = 0;
      for (; j + kLanes <= n; j += kLanes) {
        const vf v = load(p + j) * splat(inv);
        tops = v > tops ? v : tops;
      }
      float top = -std::numeric_limits<float>::infinity();
      for (int l = 0; l < kLanes; ++l) top = std::max(top, tops[l]);
      for (; j < n; ++j) top = std::max(top, p[j] * inv);
      for (j = 0; j + kLanes <= n; j += kLanes) {
        const vf x = load(p + j);
        const vi gone = x == splat(-std::numeric_limits<float>::infinity());  // exp_approx clamps, -inf weighs 0
        const vf weight = exp_approx(x * splat(inv) - splat(top));
        store(e.data() + j, gone ? vf{} : weight);
      }
      for (; j < n; ++j) e[j] = std::exp(p[j] * inv - top);
      double total = 0.0;
      for (j = 0; j < n; ++j) total += e[j];
      const double target = u[i] * total;
      double running = 0.0;
      int64_t pick = -1, last = 0;
      for (j = 0; j < n; ++j) {
        if (e[j] == 0.0f) continue;
        last = j;
        running += e[j];
        if (running > target) {
          pick = j;
          break;
        }
      }
      o[i] = pick >= 0 ? pick : last;  // rounding left the draw past the end: the last token that can come out
    }
  });
  return out;
}

// The index of each row's largest value (the first of equals; a NaN counts as largest), as torch.argmax.
torch::Tensor argmax_rows(torch::Tensor logits) {
  RECORD_FUNCTION("mcpmux::argmax", {});
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 && logits.dim() == 2 && logits.stride(1) == 1,
              "logits must be float32 [N, V] with contiguous rows");
  const int64_t rows = logits.size(0), n = logits.size(1);
  TORCH_CHECK(n >= 1, "logits must have at least one column");
  auto out = torch::empty({rows}, logits.options().dtype(torch::kInt64));
  int64_t* o = out.data_ptr<int64_t>();
  pool::parallel_for(0, rows, grain_rows(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* p = logits.data_ptr<float>() + r * logits.stride(0);
      // Each lane keeps its first largest value and where it was; NaNs are only noted, then looked for.
      vf top = vf{} - std::numeric_limits<float>::infinity();
      vi where = vi{} - 1, nan = vi{};
      vi index;
      for (int l = 0; l < kLanes; ++l) index[l] = l;
      int64_t i = 0;
      for (; i + kLanes <= n; i += kLanes, index += kLanes) {
        const vf v = load(p + i);
        const vi greater = v > top;
        top = greater ? v : top;
        where = greater ? index : where;
        nan |= v != v;
      }
      float best_value = -std::numeric_limits<float>::infinity();
      int64_t best = -1;
      bool any_nan = false;
      for (int l = 0; l < kLanes; ++l) {
        any_nan |= nan[l] != 0;
        if (where[l] >= 0 && (top[l] > best_value || (top[l] == best_value && where[l] < best))) {
          best_value = top[l];
          best = where[l];
        }
      }
      for (; i < n; ++i) {
        any_nan |= p[i] != p[i];
        if (p[i] > best_value) {
          best_value = p[i];
          best = i;
        }
      }
      if (any_nan) {
        best = 0;
        while (p[best] == p[best]) ++best;
      } else if (best < 0) {
        best = 0;  // every value is -inf
      }
      o[r] = best;
    }
  });
  return out;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  namespace py = pybind11;
  using Release = py::call_guard<py::gil_scoped_release>;  // other threads run Python meanwhile
  m.def("rms_norm", &rms_norm, Release());
  m.def("rotary_", &rotary_, Release());
  m.def("write_kv_", &write_kv_, Release());
  m.def("paged_attention_", &paged_attention_, Release());
  m.def("silu_and_mul", &silu_and_mul, Release());
  m.def("argmax_rows", &argmax_rows, Release());
  m.def("top_k_rows", &top_k_rows, Release());
  m.def("sample_rows", &sample_rows, Release());
  m.def("linear", &linear, Release());
  m.def("swiglu", &swiglu, Release());
  m.def("logits", &logits, Release());
  m.def("amx_built", &amx::built);
  m.def("packed_built", &amx::packed_built);
  m.def("packed_f32_built", &amx::packed_f32_built);
  m.def("set_pool", &pool::set_pool);
  m.def("set_pool_quiet", &pool::set_quiet);
  m.def("set_onednn_rows", &set_onednn_rows);
  py::class_<Decoder>(m, "Decoder")
      .def(py::init<std::vector<std::vector<c10::optional<torch::Tensor>>>, int64_t, int64_t, int64_t, double,
                    double, int64_t, int64_t>())
      .def("run", &Decoder::run, Release());
}
"""
