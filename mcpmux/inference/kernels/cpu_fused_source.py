"""C++ source of the fused CPU kernels (`cpu_fused` builds it with `torch.utils.cpp_extension.load_inline`).

Each kernel does in one pass over its rows what the torch reference does in several operators, for
float32 tensors whose rows are contiguous. The arithmetic is the reference's, operation for
operation, in float32, with floating-point contraction off (no fused multiply-adds the reference
does not do): rotary, the KV write and SiLU * up match it bit for bit (SiLU is ATen's own, called
from C++); RMSNorm sums its squares, and decode attention its scores and values, in another order
than the reference (SDPA's blocked softmax), so both match it to rounding.
"""

SOURCE = r"""
#include <torch/extension.h>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace {

constexpr int64_t kLanes = 8;

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be 2-D with contiguous rows");
}

inline float dot(const float* __restrict__ a, const float* __restrict__ b, int64_t n) {
  float acc[kLanes] = {0.0f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += a[i + j] * b[i + j];
  }
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  float total = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

float sum_of_squares(const float* v, int64_t n) { return dot(v, v, n); }

}  // namespace

// weight * (h * rsqrt(mean(h^2) + eps)) with h = x (+ residual); returns {normed, h}.
std::vector<torch::Tensor> rms_norm(torch::Tensor x, c10::optional<torch::Tensor> residual, torch::Tensor weight,
                                    double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  TORCH_CHECK(weight.is_contiguous() && weight.numel() == n, "weight must hold one contiguous value per column");
  auto h = residual.has_value() ? torch::empty({rows, n}, x.options()) : x;
  if (residual.has_value()) check_rows(*residual, "residual");
  auto out = torch::empty({rows, n}, x.options());
  const float* w = weight.data_ptr<float>();
  const float epsf = static_cast<float>(eps);
  {
    for (int64_t r = 0; r < rows; ++r) {
      float* hr = h.data_ptr<float>() + r * h.stride(0);
      if (residual.has_value()) {
        const float* xr = x.data_ptr<float>() + r * x.stride(0);
        const float* rr = residual->data_ptr<float>() + r * residual->stride(0);
        for (int64_t i = 0; i < n; ++i) hr[i] = xr[i] + rr[i];
      }
      const float inv = 1.0f / std::sqrt(sum_of_squares(hr, n) / static_cast<float>(n) + epsf);
      float* o = out.data_ptr<float>() + r * n;
      for (int64_t i = 0; i < n; ++i) o[i] = w[i] * (hr[i] * inv);
    }
  }
  return {out, h};
}

// NeoX rotary embedding of the first rotary_dim features of every head of q and k, in place.
void rotary_(torch::Tensor positions, torch::Tensor q, torch::Tensor k, torch::Tensor cos_sin) {
  TORCH_CHECK(positions.scalar_type() == torch::kInt64 && positions.is_contiguous(), "positions must be int64");
  TORCH_CHECK(cos_sin.scalar_type() == torch::kFloat32 && cos_sin.is_contiguous(), "cos_sin must be float32");
  const int64_t tokens = q.size(0), rotary = cos_sin.size(1), half = rotary / 2;
  const int64_t* pos = positions.data_ptr<int64_t>();
  for (const torch::Tensor* t : {&q, &k}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->dim() == 3 && t->stride(2) == 1,
                "q and k must be float32 [T, H, D] with contiguous heads");
    TORCH_CHECK(t->size(0) == tokens && t->size(2) >= rotary, "q and k must have a row per position");
  }
  for (torch::Tensor* t : {&q, &k}) {
    const int64_t heads = t->size(1), s0 = t->stride(0), s1 = t->stride(1);
    float* base = t->data_ptr<float>();
    {
      for (int64_t i = 0; i < tokens; ++i) {
        const float* c = cos_sin.data_ptr<float>() + pos[i] * rotary;
        const float* s = c + half;
        for (int64_t head = 0; head < heads; ++head) {
          float* x = base + i * s0 + head * s1;
          for (int64_t j = 0; j < half; ++j) {
            const float x1 = x[j], x2 = x[j + half];
            x[j] = x1 * c[j] + (-x2) * s[j];
            x[j + half] = x2 * c[j] + x1 * s[j];
          }
        }
      }
    }
  }
}

// Scatter key/value [T, Hkv, D] (heads contiguous within a row) into the paged caches at slot_mapping
// (block * block_size + offset; negative: skip), in place.
void write_kv_(torch::Tensor key, torch::Tensor value, torch::Tensor k_cache, torch::Tensor v_cache,
               torch::Tensor slot_mapping) {
  TORCH_CHECK(slot_mapping.scalar_type() == torch::kInt64 && slot_mapping.is_contiguous(), "slots must be int64");
  const int64_t row = k_cache.size(2) * k_cache.size(3), slots = k_cache.size(0) * k_cache.size(1);
  for (const torch::Tensor* t : {&key, &value}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->stride(2) == 1 && t->stride(1) == t->size(2) &&
                    t->size(1) * t->size(2) == row, "key and value must be float32 [T, Hkv, D], each row contiguous");
  }
  for (const torch::Tensor* t : {&k_cache, &v_cache}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous(), "the caches must be contiguous float32");
  }
  const int64_t* slot = slot_mapping.data_ptr<int64_t>();
  for (int64_t i = 0; i < key.size(0); ++i) {
    if (slot[i] < 0) continue;
    TORCH_CHECK(slot[i] < slots, "slot ", slot[i], " is outside the cache");
    std::memcpy(k_cache.data_ptr<float>() + slot[i] * row, key.data_ptr<float>() + i * key.stride(0), row * 4);
    std::memcpy(v_cache.data_ptr<float>() + slot[i] * row, value.data_ptr<float>() + i * value.stride(0), row * 4);
  }
}

// Attention of one query row per sequence (a decode step: row i is sequence i) over its paged context,
// read in place through its block table: scores, softmax, weighted sum of values. q: [S, H, D]; caches:
// [blocks, block_size, Hkv, D]; block_tables: [S, max_blocks] int32; seq_lens: [S] int32. Returns [S, H, D].
torch::Tensor decode_attention(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                               torch::Tensor block_tables, torch::Tensor seq_lens, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && q.dim() == 3 && q.stride(2) == 1, "q must be float32 [S, H, D]");
  for (const torch::Tensor* t : {&k_cache, &v_cache}) {
    TORCH_CHECK(t->scalar_type() == torch::kFloat32 && t->is_contiguous(), "the caches must be contiguous float32");
  }
  TORCH_CHECK(block_tables.scalar_type() == torch::kInt32 && block_tables.is_contiguous(), "block tables: int32");
  TORCH_CHECK(seq_lens.scalar_type() == torch::kInt32 && seq_lens.is_contiguous(), "seq_lens: int32");
  const int64_t seqs = q.size(0), heads = q.size(1), dim = q.size(2);
  const int64_t block = k_cache.size(1), kv_heads = k_cache.size(2), group = heads / kv_heads;
  const int64_t max_blocks = block_tables.size(1), row = kv_heads * dim;
  TORCH_CHECK(seq_lens.size(0) == seqs && block_tables.size(0) == seqs, "one query row per sequence");
  auto out = torch::empty({seqs, heads, dim}, q.options());
  const float* kc = k_cache.data_ptr<float>();
  const float* vc = v_cache.data_ptr<float>();
  const int32_t* tables = block_tables.data_ptr<int32_t>();
  const int32_t* lens = seq_lens.data_ptr<int32_t>();
  const float scalef = static_cast<float>(scale);
  const float* qp = q.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  for (int64_t s = 0; s < seqs; ++s) {
    TORCH_CHECK(lens[s] >= 1 && lens[s] <= max_blocks * block, "sequence ", s,
                " has a context its block table cannot hold");
  }
  {
    std::vector<float> scores;
    std::vector<float> acc(group * dim);
    for (int64_t item = 0; item < seqs * kv_heads; ++item) {
      const int64_t s = item / kv_heads, kvh = item % kv_heads, len = lens[s];
      const int32_t* table = tables + s * max_blocks;
      const float* qs = qp + s * qs0 + kvh * group * qs1;
      scores.resize(group * len);
      for (int64_t j = 0; j < len; ++j) {
        const float* k = kc + (static_cast<int64_t>(table[j / block]) * block + j % block) * row + kvh * dim;
        for (int64_t g = 0; g < group; ++g) scores[g * len + j] = dot(qs + g * qs1, k, dim) * scalef;
      }
      for (int64_t g = 0; g < group; ++g) {
        float* p = scores.data() + g * len;
        float top = p[0], total = 0.0f;
        for (int64_t j = 1; j < len; ++j) top = std::max(top, p[j]);
        for (int64_t j = 0; j < len; ++j) total += (p[j] = std::exp(p[j] - top));
        for (int64_t j = 0; j < len; ++j) p[j] /= total;
      }
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t j = 0; j < len; ++j) {
        const float* __restrict__ v =
            vc + (static_cast<int64_t>(table[j / block]) * block + j % block) * row + kvh * dim;
        for (int64_t g = 0; g < group; ++g) {
          const float p = scores[g * len + j];
          float* __restrict__ a = acc.data() + g * dim;
          for (int64_t d = 0; d < dim; ++d) a[d] += p * v[d];
        }
      }
      std::copy(acc.begin(), acc.end(), op + (s * heads + kvh * group) * dim);
    }
  }
  return out;
}

// silu(gate) * up for gate_up = [gate | up] along the last dimension: ATen's own vectorized SiLU,
// called from here rather than through Python's dispatch.
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  auto halves = gate_up.chunk(2, -1);
  return at::silu(halves[0]).mul_(halves[1]);
}
"""

FUNCTIONS = ["rms_norm", "rotary_", "write_kv_", "decode_attention", "silu_and_mul"]
