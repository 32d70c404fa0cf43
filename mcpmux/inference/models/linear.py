"""The model's matrix products, laid out for the CPU's math library at every batch size.

Four implementations can multiply on CPU, and which is faster depends on the CPU and the rows:

- **The packed product** (`kernels.cpu_amx_source`, where the fused kernels are enabled): `prepare` packs a
  weight whose sides are multiples of 32 into the kernels' own layout (`pack`, a 5-D or 6-D tensor only
  `linear` reads), and every product on it, decode or prefill, runs there. bfloat16 where the CPU has AMX
  (on its tiles: 1.5-2.3x oneDNN's bfloat16 product at 1-32 rows, about equal from 64 up, the output head
  0.8x at 64-128 rows) or AVX512-BF16 (AMD Zen 4 and later: dot products on the same layout); float32
  where it has AVX-512 (FMAs on the same layout: SmolLM2's layer products 1.05-1.6x oneDNN's at 1-64 rows
  on an AMD Zen 5, 0.94-1.02x at 512, docs/perf.md). Either way each output is summed in one fixed
  order whatever the rows beside it: greedy answers do not depend on the batch's products. Until the
  kernels are built, `linear` multiplies the unpacked weight with ATen (slower, same result up to
  rounding).
  `MCPMUX_CPU_MATMUL=onednn` keeps oneDNN's layout instead.

- **The fused kernels' dot product** (`kernels.cpu_fused`, float32 on CPUs without AVX-512, wherever those
  kernels are enabled): each output a 16-lane dot product of a row of `x` with a row of the plain weight,
  four weight rows read once for six rows of `x`, the next four prefetched while these multiply (on an
  AMX Xeon 1.2-1.5x oneDNN's product at 4-48 rows, on an AMD Zen 5 0.7x; with AVX-512 the packed product
  above now takes float32 instead, measured on the Zen 5 only). So where
  the kernels are enabled, `prepare` leaves float32 weights plain unless oneDNN's 32-row product is 1.3x
  the dot product's (timed once a process, once the kernels are built: `float32_on_onednn`), the dot
  product takes up to `FUSED_ROWS` rows, and larger (prefill) products go to oneDNN on the plain weight
  where it is 1.5x faster than MKL (timed once a process, `cpu_fused`), else to MKL: on its own team, or
  where that team would wait at a barrier for a core other processes take (a full 512-row prefill step,
  or the thread governor having shrunk torch's team) as single-threaded MKL products on blocks of output
  columns split over the kernels' pool (`pool_gemm`, the same sums; docs/perf.md, "Prefill where prompts
  queue"); until the kernels are built, the BLAS path below serves.

- **oneDNN** (`prepare` turns a weight into its tensor once, at load, packed into the blocked layout
  oneDNN's kernels read for `PACK_ROWS`-row products): on CPUs where MKL takes its AVX2 code path
  though the CPU has AVX-512 (AMD EPYC, for one), oneDNN uses AVX-512 and runs SmolLM2's layer
  products 2x faster at 16-256 rows, its output head 2.3x (a 64-sequence decode step 159 -> 82 ms).
  On an AVX2-only EPYC the packing alone makes oneDNN 1.2-1.7x faster than MKL at 4-32 rows (a
  plain oneDNN tensor is not faster there) and equal from 64 rows up. `prepare` times both
  libraries once per process and dtype on a layer-sized product and keeps the plain weight unless
  oneDNN wins by 10%; `MCPMUX_CPU_MATMUL=onednn|blas` forces the choice.
- **MKL (BLAS)**, through torch's `mm`. `F.linear(x, W)` asks for ``x @ W.T``, with the weight as
  the second operand, which MKL copies (packs) on every call; for the few rows of a decode step
  the copy costs as much as the product. Asking for the transposed product ``W @ x.T`` puts the
  weight first, where MKL streams it once: 1.5-2x faster at 2-4 rows, 1.1-1.5x at 16-64 on an AVX2
  host, about even from 256 rows up. The output head (49k vocab rows against the few rows a step
  samples) runs above 8 rows as ``x @ W.T`` in vocab slices (`vocab_linear`), which stay in cache
  between their packing and their use.

Each output element is the dot product of a row of `x` with a row of `W` whichever way it runs,
summed in another order: results match `F.linear` to rounding, not bit for bit.
"""

from __future__ import annotations

import logging
import os
import threading
from functools import partial

import torch
from torch import Tensor
from torch.nn import functional as F

from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.kernels import cpu_fused
from mcpmux.inference.kernels.timing import best_seconds

logger = logging.getLogger(__name__)

# Up to this many rows the transposed product wins with MKL; larger prefill chunks keep `F.linear`.
SKINNY_ROWS = 128
# Up to this many rows the output head runs as the transposed product, above it in vocab slices.
SKINNY_HEAD_ROWS = 8
# Vocab rows per sliced head matmul: a 2k-row slice of a 576-wide head (4.5 MiB) stays in cache.
VOCAB_SLICE = 2048
# The product size oneDNN's weight layout is chosen for: decode steps of a few dozen sequences,
# where the packing pays most (any row count runs on it, and gives the same result).
PACK_ROWS = 32
# Up to this many float32 rows the fused kernels' dot product multiplies (prefill chunks go to ATen: batch
# invariance does not extend to float32, where the dot product on every row cost 1.4-2x, docs/perf.md).
FUSED_ROWS = 64

# The packed layout's block side: a packed weight's rows and columns must be multiples of it.
PACK_BLOCK = 32

MATMUL_ENV = "MCPMUX_CPU_MATMUL"
"""`onednn` or `blas` forces the layout `prepare` gives weights (oneDNN's, or plain for MKL and the fused
kernels' dot product); unset or `auto`, float32 weights stay plain where the fused kernels are enabled
(unless oneDNN is much the faster: `float32_on_onednn`),
bfloat16 ones are packed where the CPU has AMX or AVX512-BF16, and otherwise `prepare` measures."""


def prepare(weight: Tensor) -> Tensor:
    """`weight` as `linear` multiplies it fastest here: a oneDNN tensor on CPUs where oneDNN wins, else itself.

    A oneDNN tensor has no storage `F.linear` can read: only `linear` and `vocab_linear` take it. A
    weight `prepare` made already is returned as it is.
    """
    if weight.is_mkldnn or is_packed(weight) or weight.device.type != "cpu":
        return weight
    if _packs(weight):
        return pack(weight.detach())
    if _matmul_setting() == "auto" and weight.dtype == torch.float32 and cpu_fused.enabled():
        if not _float32_to_onednn():
            return weight  # the fused kernels' dot product reads the plain weight
        return _onednn_packed(weight.detach())
    if not _onednn_wins(weight.dtype):
        return weight
    return _onednn_packed(weight.detach())


def float32_on_onednn() -> bool:
    """Whether `prepare` has given float32 weights oneDNN's layout though the fused kernels are enabled (their
    products then run on torch's team, not on the kernels' pool)."""
    return _float32_on_onednn is True


def _float32_to_onednn() -> bool:
    """Whether float32 weights go to oneDNN's packed layout though the fused kernels are enabled: where oneDNN's
    32-row product is at least 1.3x as fast as the kernels' dot product (the dot product takes 1.3-1.4x oneDNN's time on
    an AMD Zen 5, 0.67-0.83x on an AMX Xeon). Timed once a process, once the kernels are built (under batch invariance
    the engine waits for them before its first step in any case); False without them or without oneDNN."""
    global _float32_on_onednn
    with _deciding:
        if _float32_on_onednn is None:
            _float32_on_onednn = _onednn_beats_dot()
        return _float32_on_onednn


_float32_on_onednn: bool | None = None


def _onednn_beats_dot() -> bool:
    # Under batch invariance the first step waits for the kernels anyway; without it, loading does not wait.
    fused = cpu_fused.wait() if cpu_fused.batch_invariant() else cpu_fused.ops()
    if fused is None or not torch.backends.mkldnn.is_available():
        return False
    weights = _probe_weights(torch.float32)
    packs = [_onednn_packed(weight) for weight in weights]
    x = torch.randn(PACK_ROWS, 576, generator=torch.Generator().manual_seed(1))
    seconds = best_seconds(
        {
            "dot": lambda: [fused.linear(x, w, None, FUSED_ROWS) for w in weights],
            "onednn": lambda: [fused.linear(x, w, None, FUSED_ROWS) for w in packs],
        },
        _PROBE_ROUNDS,
    )
    dot, onednn = seconds["dot"] / _PROBE_WEIGHTS, seconds["onednn"] / _PROBE_WEIGHTS
    wins = onednn * 1.3 <= dot
    logger.info(
        "float32 decode products: the fused dot product %.0f us, oneDNN %.0f us per 32-row product: %s",
        dot * 1e6, onednn * 1e6, "oneDNN" if wins else "the dot product",
    )  # fmt: skip
    return wins


def _onednn_packed(weight: Tensor) -> Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight, PACK_ROWS)


def _packs(weight: Tensor) -> bool:
    """Whether `prepare` packs this weight for the packed product: bfloat16 on AMX tiles or AVX512-BF16 dot
    products, float32 on AVX-512 FMAs."""
    capable = {torch.bfloat16: cpu_fused.packed_bf16, torch.float32: cpu_fused.packed_f32}.get(weight.dtype)
    return (
        capable is not None
        and weight.dim() == 2
        and weight.shape[0] % PACK_BLOCK == 0
        and weight.shape[1] % PACK_BLOCK == 0
        and _matmul_setting() == "auto"
        and cpu_fused.enabled()
        and capable()
    )


def pack(weight: Tensor) -> Tensor:
    """[N, K] as the packed product reads it (`kernels.cpu_amx_source`): each block of 32 output columns a run of
    2 KiB steps along K, each step two halves of 16 columns with 16 rows of 64 bytes: bfloat16 [N/32, K/32, 2, 16,
    16, 2] (a row holds a pair of K for 16 columns), float32 [N/32, K/16, 2, 16, 16] (one K for 16 columns)."""
    n, k = weight.shape
    if weight.dtype == torch.float32:
        tiles = weight.reshape(n // PACK_BLOCK, 2, 16, k // 16, 16)  # (block, half, column, step, k)
        return tiles.permute(0, 3, 1, 4, 2).contiguous()
    tiles = weight.reshape(n // PACK_BLOCK, 2, 16, k // PACK_BLOCK, 16, 2)  # (block, half, column, step, pair, e)
    return tiles.permute(0, 3, 1, 4, 2, 5).contiguous()


def unpack(weight: Tensor) -> Tensor:
    """The [N, K] weight `pack` packed."""
    if weight.dim() == 5:
        return weight.permute(0, 2, 4, 1, 3).reshape(weight.shape[0] * PACK_BLOCK, weight.shape[1] * 16)
    return weight.permute(0, 2, 4, 1, 3, 5).reshape(weight.shape[0] * PACK_BLOCK, weight.shape[1] * PACK_BLOCK)


def is_packed(weight: Tensor) -> bool:
    return not weight.is_mkldnn and weight.dim() in (5, 6)


def in_features(weight: Tensor) -> int:
    """The width of the rows `weight` (from `prepare`) multiplies."""
    if not is_packed(weight):
        return weight.shape[1]
    return weight.shape[1] * (16 if weight.dim() == 5 else PACK_BLOCK)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.linear(x, weight, bias)`` for a 2-D `x`, row-major like it, with `weight` from `prepare`."""
    fused = cpu_fused.ops() if x.device.type == "cpu" else None
    if fused is not None:
        return fused.linear(x, weight, bias, FUSED_ROWS)
    if is_packed(weight):  # the kernels are still being built
        return F.linear(x, unpack(weight), bias)
    if weight.is_mkldnn:
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), weight, bias, "none", [], "")
    if x.device.type != "cpu" or x.shape[0] > SKINNY_ROWS:
        return F.linear(x, weight, bias)
    return _transposed(x, weight, bias)


def vocab_linear(x: Tensor, weight: Tensor) -> Tensor:
    """``F.linear(x, weight)`` for a large output head, with `weight` from `prepare`."""
    if weight.is_mkldnn or is_packed(weight) or (x.shape[0] <= FUSED_ROWS and cpu_fused.ops() is not None):
        return linear(x, weight)
    if x.device.type != "cpu" or weight.shape[0] <= VOCAB_SLICE:
        return F.linear(x, weight)
    if x.shape[0] <= SKINNY_HEAD_ROWS:
        return _transposed(x, weight, None)
    out = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype)
    for start in range(0, weight.shape[0], VOCAB_SLICE):
        end = start + VOCAB_SLICE
        torch.mm(x, weight[start:end].t(), out=out[:, start:end])
    return out


def vocab_logits(x: Tensor, weight: Tensor) -> Tensor:
    """``vocab_linear(x, weight).float()``, the output head's float32 logits: on a packed weight the product widens
    each logit as it rounds it (the same values, without a second pass over a [rows, vocab] tensor)."""
    fused = cpu_fused.ops() if x.device.type == "cpu" else None
    if fused is not None and is_packed(weight):
        return fused.logits(x, weight, FUSED_ROWS)
    return vocab_linear(x, weight).float()


def _transposed(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
    # A contiguous `x` makes `x.T` the transposed operand MKL handles fast; a transposed `x` would be
    # taken as a plain one and run at half the speed. The result is copied back to row-major (a few
    # rows: cheap) so that the next product, and kernels that need contiguous rows, get one.
    x_t = x.contiguous().t()
    product = torch.mm(weight, x_t) if bias is None else torch.addmm(bias.unsqueeze(1), weight, x_t)
    return product.t().contiguous()


def _onednn_wins(dtype: torch.dtype) -> bool:
    """Whether oneDNN multiplies `dtype` matrices at least 10% faster than MKL on this CPU (decided once per
    process and dtype; concurrent loads wait for the first to decide)."""
    with _deciding:
        known = _decided.get(dtype)
        if known is None:
            known = _decided[dtype] = _decide(dtype)
        return known


_deciding = threading.Lock()
_decided: dict[torch.dtype, bool] = {}


def _probe_weights(dtype: torch.dtype) -> list[Tensor]:
    # SmolLM2's gate projection, several times over: a model's step reads each weight from memory
    # once, and a single weight that stays in cache would time a product no step runs.
    generator = torch.Generator().manual_seed(0)
    return [torch.randn(1536, 576, generator=generator).to(dtype) for _ in range(_PROBE_WEIGHTS)]


def _matmul_setting() -> str:
    setting = os.environ.get(MATMUL_ENV, "auto").strip().lower()
    if setting not in ("auto", "onednn", "blas"):
        raise InvalidSettingError(f"{MATMUL_ENV}={setting!r}: expected onednn, blas or auto")
    return setting


def _decide(dtype: torch.dtype) -> bool:
    forced = _matmul_setting()
    if forced == "blas" or not torch.backends.mkldnn.is_available():
        return False
    weights = _probe_weights(dtype)
    # A decode step of one sequence and one of many: oneDNN's packing pays most at the second, but
    # a step of one sequence is what an interactive user waits on.
    generator = torch.Generator().manual_seed(1)
    inputs = [torch.randn(n, 576, generator=generator).to(dtype) for n in (1, PACK_ROWS)]
    try:
        packs = [_onednn_packed(weight) for weight in weights]
        linear(inputs[0], packs[0])
    except Exception as err:  # no oneDNN kernel for this dtype on this CPU (float16 without AVX-512 FP16)
        log = logger.warning if forced == "onednn" else logger.info
        log("CPU matmul, %s: oneDNN cannot run it here (%s); BLAS multiplies", dtype, err)
        return False
    if forced == "onednn":
        return True
    seconds = best_seconds(
        {"onednn": partial(_multiply_all, inputs, packs), "blas": partial(_multiply_all, inputs, weights)},
        _PROBE_ROUNDS,
    )
    onednn, blas = seconds["onednn"] / _PROBE_WEIGHTS, seconds["blas"] / _PROBE_WEIGHTS
    wins = onednn < 0.9 * blas
    logger.info(
        "CPU matmul, %s: oneDNN %.0f us, BLAS %.0f us per 1- and 32-row product: %s (%s=onednn|blas to choose)",
        dtype, onednn * 1e6, blas * 1e6, "oneDNN" if wins else "BLAS", MATMUL_ENV,
    )  # fmt: skip
    return wins


_PROBE_ROUNDS = 9
_PROBE_WEIGHTS = 16  # 56 MiB in float32, more than a CPU's last-level cache


def _multiply_all(inputs: list[Tensor], weights: list[Tensor]) -> None:
    for x in inputs:
        for weight in weights:
            linear(x, weight)


def fastest_cpu_dtype() -> torch.dtype:
    """bfloat16 where this CPU multiplies it at least a third faster than float32 (AMX or AVX512-BF16 through
    oneDNN), else float32: the products are most of a CPU step, and the fused kernels run both dtypes.

    Decided once per process (concurrent loads wait for the first), as a decode step multiplies: each
    dtype's weights as `prepare` leaves them, 16 of them (read from memory, as a step reads them), at 1
    and `PACK_ROWS` rows; interleaved rounds, the fastest of each. Where the fused kernels multiply on AMX
    tiles it is bfloat16 without measuring (`_by_capability`).
    """
    global _fastest_dtype
    with _choosing_dtype:
        if _fastest_dtype is None:
            _fastest_dtype = _by_capability() or _measure_dtypes()
        return _fastest_dtype


def _by_capability() -> torch.dtype | None:
    """bfloat16 where the fused kernels multiply it on the packed layout (AMX tiles: 2-4x float32's products there;
    AVX512-BF16 dot products: 2-4.7x on an AMD Zen 5), decided without timing: a measurement on a busy host could
    pick float32 on one start and bfloat16 on the next, and the two give different greedy answers. None: measure."""
    if _matmul_setting() == "auto" and cpu_fused.enabled() and cpu_fused.packed_bf16():
        how = "on AMX tiles" if cpu_fused.amx_tiles() else "with AVX512-BF16 dot products"
        logger.info("CPU dtype: bfloat16 (this CPU multiplies it %s)", how)
        return torch.bfloat16
    return None


_choosing_dtype = threading.Lock()
_fastest_dtype: torch.dtype | None = None


def _measure_dtypes() -> torch.dtype:
    dtypes = (torch.float32, torch.bfloat16)
    # A packable weight is timed in oneDNN's layout: the kernels may still be building, and AMX only widens the gap.
    probes = {dtype: _probe_weights(dtype) for dtype in dtypes}
    weights = {dtype: [_onednn_packed(w) if _packs(w) else prepare(w) for w in probes[dtype]] for dtype in dtypes}
    generator = torch.Generator().manual_seed(1)
    inputs = {dtype: [torch.randn(n, 576, generator=generator).to(dtype) for n in (1, PACK_ROWS)] for dtype in dtypes}
    try:
        seconds = best_seconds({dtype: partial(_multiply_all, inputs[dtype], weights[dtype]) for dtype in dtypes},
                               _PROBE_ROUNDS)  # fmt: skip
    except RuntimeError as err:  # no bfloat16 product on this CPU at all
        logger.info("CPU dtype: bfloat16 products do not run here (%s): float32", err)
        return torch.float32
    fastest = torch.bfloat16 if seconds[torch.bfloat16] * 4 / 3 <= seconds[torch.float32] else torch.float32
    per_product = {dtype: seconds[dtype] / (2 * _PROBE_WEIGHTS) * 1e6 for dtype in dtypes}
    logger.info(
        "CPU dtype: a decode-sized product takes %.0f us in float32, %.0f us in bfloat16: %s",
        per_product[torch.float32], per_product[torch.bfloat16], str(fastest).removeprefix("torch."),
    )  # fmt: skip
    return fastest
