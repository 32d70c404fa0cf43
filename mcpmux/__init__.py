"""mcpmux: one MCP server in front of many.

The multiplexer API imports quickly; the inference engine (torch, transformers) loads on first use:

    from mcpmux import Mux, load_config
    from mcpmux import Engine, EngineConfig, SamplingParams   # imports torch
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"  # before the imports below: modules they load read it

from mcpmux.core.config import Config, load_config
from mcpmux.errors import (
    ConfigError,
    MuxError,
    UnknownToolError,
    UnlistedToolError,
    UpstreamError,
    UpstreamTimeoutError,
    UpstreamUnavailableError,
)
from mcpmux.mux.multiplexer import Mux

if TYPE_CHECKING:
    from mcpmux.inference.engine.async_engine import Engine
    from mcpmux.inference.engine.config import EngineConfig, SamplingParams

__all__ = [
    "Config",
    "ConfigError",
    "Engine",
    "EngineConfig",
    "Mux",
    "MuxError",
    "SamplingParams",
    "UnknownToolError",
    "UnlistedToolError",
    "UpstreamError",
    "UpstreamTimeoutError",
    "UpstreamUnavailableError",
    "load_config",
]

_LAZY = {
    "Engine": "mcpmux.inference.engine.async_engine",
    "EngineConfig": "mcpmux.inference.engine.config",
    "SamplingParams": "mcpmux.inference.engine.config",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'mcpmux' has no attribute {name!r}")
