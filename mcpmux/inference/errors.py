"""The errors inference raises: for a request or a configuration (`EngineError`), or a model (`ModelLoadError`)."""

from __future__ import annotations

from mcpmux.errors import MuxError


class EngineError(MuxError):
    """Base class of the errors the inference engine raises for a request or a configuration."""


class InvalidSettingError(EngineError, ValueError):
    """A configuration or sampling value is out of range; the message names the setting and its value."""


class QueueFullError(EngineError):
    """The waiting queue is at `max_waiting`; the request was rejected, retry later or raise the limit."""


class RequestTooLargeError(EngineError):
    """The request can never fit: its prompt (+ max_tokens) exceeds the KV pool or the model's context."""


class ModelLoadError(MuxError, ValueError):
    """A model could not be loaded; the message names the path, name or architecture and what to do."""


class UnsupportedModelError(ModelLoadError):
    """The checkpoint's architecture is not one our forward computes."""
