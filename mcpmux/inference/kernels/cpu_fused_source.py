"""C++ source of the fused CPU kernels (`cpu_fused` builds it with `torch.utils.cpp_extension.load_inline`).

Each kernel does in one pass over its rows what the torch reference does in several operators, for
float32 tensors whose rows are contiguous. The arithmetic is the reference's, operation for
operation, in float32, with floating-point contraction off (no fused multiply-adds the reference
does not do): rotary and SiLU * up match it bit for bit (SiLU is ATen's own, called from C++);
RMSNorm sums its squares in another order, so it matches to rounding.
"""

SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <cmath>

namespace {

constexpr int64_t kLanes = 16;

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == torch::kFloat32, name, " must be a float32 CPU tensor");
  TORCH_CHECK(t.dim() == 2 && t.stride(1) == 1, name, " must be 2-D with contiguous rows");
}

float sum_of_squares(const float* v, int64_t n) {
  float acc[kLanes] = {0.0f};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int64_t j = 0; j < kLanes; ++j) acc[j] += v[i + j] * v[i + j];
  }
  for (; i < n; ++i) acc[0] += v[i] * v[i];
  float total = 0.0f;
  for (int64_t j = 0; j < kLanes; ++j) total += acc[j];
  return total;
}

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
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
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
  });
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
    at::parallel_for(0, tokens, 8, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) {
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
    });
  }
}

// silu(gate) * up for gate_up = [gate | up] along the last dimension: ATen's own vectorized SiLU,
// called from here rather than through Python's dispatch.
torch::Tensor silu_and_mul(torch::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  auto halves = gate_up.chunk(2, -1);
  return at::silu(halves[0]).mul_(halves[1]);
}
"""

FUNCTIONS = ["rms_norm", "rotary_", "silu_and_mul"]
