"""Fused CPU kernels for the small operators of a step: RMSNorm with its residual add, rotary, the KV
write, SiLU * up, decode attention read through the block tables (no gathered copy of the context),
and the greedy argmax, in float32 or bfloat16; the sampler's top-k and draw over float32 logits; and the
product on a packed weight layout (`cpu_amx_source`: bfloat16 on AMX tiles or AVX512-BF16 dot products,
float32 on AVX-512 FMAs), with the gate-up product and SiLU * up in one pass for the one-call decoder.

On CPU a decode step of a small model is a few large products and, around them, dozens of small
operators per layer, each paying torch's dispatch and a pass over memory; at one sequence those are
a third of the step. The kernels here (C++ in `cpu_fused_source`) do each group in one call and
one pass. They are compiled once per machine and torch install (`jit_build`: gcc and ninja, about a
minute, then cached) in a background thread started by :func:`enable`; until the build is done, and
wherever it fails, the torch reference runs (but see batch invariance below). :func:`ops` is the
built module, or None.

`MCPMUX_CPU_KERNELS`: ``auto`` (default: fused for the builtin models, see :func:`wanted`),
``fused`` (every float32 or bfloat16 CPU model) or ``torch`` (never).

The kernels split their loops over a pool of their own (`cpu_pool_source`: no barrier, so a thread that
waits for a busy core holds up only the chunk it took), sized by :func:`set_pool_threads`;
`MCPMUX_CPU_POOL=0` splits them over torch's OpenMP team instead.

**Batch invariance** (`MCPMUX_BATCH_INVARIANT`, on unless set to ``0``; :func:`batch_invariant`): every
kernel here computes a row from that row alone, in an order fixed by its position and width, whatever
else shares the step, how many threads split it, and whether the row is decoded, prefilled whole or in
chunks, or extended after a prefix-cache hit. In bfloat16 where they multiply it on the packed layout
(:func:`packed_bf16`: AMX or AVX512-BF16; the builtin models' default there) they run every part of a
step once long prefills' attention stays in them too (`kernels.direct_pairs`), so greedy decoding gives
the same tokens for a prompt whatever the batch. float32 (whose contract is equality with Hugging Face's
output, to float32's rounding) is invariant too where the CPU has AVX-512 (:func:`packed_f32`): its products
are the packed layout's at every row count and its attention the kernels' at every length, the faster
there; elsewhere its products above `FUSED_ROWS` rows are MKL's (or oneDNN's where it is much the faster,
`_onednn_beats_mkl`), where the dot product on every row cost 1.4-2x, and long prefills take SDPA
(docs/perf.md). The torch kernels round differently, so a model that runs these kernels waits for their
first build before its first step (`ModelRunner`) instead of answering with the torch kernels
meanwhile: its answers never change when the build completes. With ``0``, steps run the torch kernels
until the build is done, and long bfloat16 prefills take SDPA.
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
import time
from functools import cache
from types import ModuleType

import torch

from mcpmux.inference.errors import InvalidSettingError
from mcpmux.inference.kernels.cpu_amx_source import SOURCE as AMX_SOURCE
from mcpmux.inference.kernels.cpu_fused_source import SOURCE
from mcpmux.inference.kernels.cpu_pool_source import SOURCE as POOL_SOURCE
from mcpmux.inference.kernels.jit_build import load as build_and_load
from mcpmux.inference.kernels.timing import best_seconds

logger = logging.getLogger(__name__)

ENV_VAR = "MCPMUX_CPU_KERNELS"
_MODES = ("auto", "fused", "torch")
INVARIANT_ENV_VAR = "MCPMUX_BATCH_INVARIANT"
POOL_ENV_VAR = "MCPMUX_CPU_POOL"

_lock = threading.Lock()
_module: ModuleType | None = None
_thread: threading.Thread | None = None
_active = False
_pool_threads = -1  # the kernels' pool: torch's count of the calling thread until set_pool_threads
_pool_quiet = False  # how its threads wait: as on a busy host, until set_pool_quiet


def ops() -> ModuleType | None:
    """The compiled kernels once they are built, else None (not enabled, still building, failed, disabled)."""
    return _module if _active else None


def enabled() -> bool:
    """Whether :func:`enable` was called (and not undone): the kernels run here once built."""
    return _active


def disable() -> None:
    """Run the torch kernels again in this process (the built kernels stay loaded for :func:`enable`)."""
    global _active
    _active = False


# -fopenmp compiles `at::parallel_for`'s pragmas (MCPMUX_CPU_POOL=0) and the kernels' `omp simd` loops; the
# link gets no -fopenmp, so the OpenMP calls resolve to the runtime torch already loaded (linking the system's
# libgomp would start a second team, whose threads torch's thread setting does not reach), and
# `at::parallel_for` applies torch's thread count on whichever thread calls it.
_CFLAGS = ["-O3", "-march=native", "-ffp-contract=off", "-fopenmp"]


@cache
def batch_invariant() -> bool:
    """Whether every step runs on these kernels alone once they are enabled (module docstring); read once."""
    value = os.environ.get(INVARIANT_ENV_VAR, "1").strip().lower()
    if value not in ("0", "1", "true", "false", "on", "off"):
        raise InvalidSettingError(f"{INVARIANT_ENV_VAR}={value!r}: expected 1 (the default) or 0")
    return value in ("1", "true", "on")


def wanted(*, builtin: bool) -> bool:
    """Whether a float32 or bfloat16 CPU model (`builtin`: a builtin model) should run the fused kernels."""
    mode = os.environ.get(ENV_VAR, "auto").strip().lower()
    if mode not in _MODES:
        raise InvalidSettingError(f"{ENV_VAR}={mode!r}: expected one of {', '.join(_MODES)}")
    return mode == "fused" or (mode == "auto" and builtin)


def enable(*, wait: bool = False) -> ModuleType | None:
    """Start building the kernels in the background (once per process); with `wait`, wait for the build."""
    global _thread, _active
    with _lock:
        _active = True
        if _thread is None:
            _thread = threading.Thread(target=_build, name="mcpmux-cpu-kernels", daemon=True)
            _thread.start()
        thread = _thread
    if wait:
        thread.join()
    return ops()


def wait() -> ModuleType | None:
    """Wait for a build :func:`enable` started (benchmarks time the kernels a server will run); :func:`ops`."""
    thread = _thread
    if thread is not None:
        thread.join()
    return ops()


def set_pool_threads(threads: int) -> None:
    """Split the kernels' loops over `threads` threads of their pool, whatever torch's own count (the engine
    passes its most threads: the pool costs a busy host no barrier, docs/perf.md); 0: torch's OpenMP team."""
    global _pool_threads
    with _lock:
        _pool_threads = threads
        if _module is not None:
            _apply_pool(_module)


def set_pool_quiet(quiet: bool) -> None:
    """Whether other processes leave the cores free: the pool's threads then spin longer before they sleep
    (`cpu_pool_source`; the engine's governor sets it from the host's load)."""
    global _pool_quiet
    with _lock:
        _pool_quiet = quiet
        if _module is not None:
            _apply_pool(_module)


def pool_quiet() -> bool:
    """Whether the pool runs as on a quiet host now (`set_pool_quiet`)."""
    return _pool_quiet


def _apply_pool(module: ModuleType) -> None:
    module.set_pool(0 if os.environ.get(POOL_ENV_VAR, "").strip() == "0" else _pool_threads)
    module.set_pool_quiet(_pool_quiet)


@cache
def amx_tiles() -> bool:
    """Whether this CPU has AMX-BF16 tiles and the OS lets this process use them (the kernels' AMX product);
    asked once per process."""
    return bool(torch.cpu._is_amx_tile_supported() and torch._C._cpu._init_amx())


@cache
def packed_bf16() -> bool:
    """Whether the kernels multiply bfloat16 on their packed layout here (`cpu_amx_source`): on AMX tiles, or with
    AVX512-BF16 dot products (AMD Zen 4 and later, Intel from Cooper Lake); asked once per process."""
    return amx_tiles() or bool(torch.cpu._is_avx512_bf16_supported())


@cache
def packed_f32() -> bool:
    """Whether the kernels multiply float32 on their packed layout here (`cpu_amx_source`: AVX-512 FMAs); asked once
    per process."""
    return bool(torch.cpu._is_avx512_supported())


def _bf16_suffix() -> str:
    """The build's name for the bfloat16 product this CPU has: its code differs with each."""
    return "_amx" if amx_tiles() else "_bf16" if packed_bf16() else ""


def _find_ninja() -> None:
    """Put the `ninja` package's binary on PATH (torch runs `ninja` from there) where none is on it yet:
    mcpmux's own environment need not be activated, as under `make run` or a client's launch."""
    if shutil.which("ninja") is not None:
        return
    try:
        import ninja
    except ImportError:
        return  # the build fails with torch's words for it, and the torch kernels serve
    os.environ["PATH"] = os.pathsep.join([ninja.BIN_DIR, os.environ.get("PATH", "")])


def _build() -> None:
    global _module
    start = time.monotonic()
    try:
        _find_ninja()
        # Named by the CPU's instruction set (`-march=native` code must not be loaded on another CPU);
        # `jit_build` adds the source, flags, torch, Python and compiler to the name.
        capability = torch.backends.cpu.get_cpu_capability().lower() + _bf16_suffix()
        sources = [POOL_SOURCE, AMX_SOURCE, SOURCE]  # the pool, then the packed product: SOURCE calls both
        module = build_and_load(f"mcpmux_cpu_fused_{capability}", sources, _CFLAGS)
    except Exception as err:  # no compiler, no ninja, no headers: the torch reference serves
        logger.warning(
            "fused CPU kernels could not be built (%s); the torch kernels run (%s=torch skips the build)",
            err,
            ENV_VAR,
        )
        return
    if packed_bf16() and not (module.amx_built() if amx_tiles() else module.packed_built()):
        logger.warning(
            "the compiler did not target this CPU's %s (gcc 11 or later does): bfloat16 products run on "
            "unpacked weights, slowly; set %s=onednn to multiply on oneDNN instead",
            "AMX tiles" if amx_tiles() else "AVX512-BF16 instructions",
            "MCPMUX_CPU_MATMUL",
        )
    if packed_f32() and not module.packed_f32_built():
        logger.warning(
            "the compiler did not target this CPU's AVX-512: float32 products run on unpacked weights, slowly; "
            "set %s=onednn to multiply on oneDNN instead",
            "MCPMUX_CPU_MATMUL",
        )
    module.set_onednn_rows(_onednn_beats_mkl())
    with _lock:
        _module = module
        _apply_pool(module)
    logger.info("fused CPU kernels ready after %.1f s", time.monotonic() - start)


def _onednn_beats_mkl() -> bool:
    """Whether oneDNN multiplies a float32 prefill product (512 rows, SmolLM2's QKV) at least 1.5x as fast as MKL
    here, on the same plain weight: MKL takes its AVX2 path on AMD CPUs with AVX-512 (2.3x oneDNN's time on a Zen
    5), where on Intel the two are about even. Timed once a process, best of five; the margin keeps a busy host
    from flipping it, and either library's sums match `F.linear` to rounding."""
    if not torch.backends.mkldnn.is_available():
        return False
    generator = torch.Generator().manual_seed(0)
    x, weight = torch.randn(512, 576, generator=generator), torch.randn(960, 576, generator=generator)
    products = {
        "mkl": lambda: torch.mm(x, weight.t()),
        "onednn": lambda: torch.ops.mkldnn._linear_pointwise(x, weight, None, "none", [], ""),
    }
    seconds = best_seconds(products, rounds=5)
    faster = seconds["onednn"] * 1.5 <= seconds["mkl"]
    logger.info(
        "float32 prefill products: MKL %.2f ms, oneDNN %.2f ms: %s",
        seconds["mkl"] * 1e3, seconds["onednn"] * 1e3, "oneDNN" if faster else "MKL",
    )  # fmt: skip
    return faster
