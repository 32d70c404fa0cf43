"""The OpenAI-compatible HTTP API over an `InferenceService`."""
