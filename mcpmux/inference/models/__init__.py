"""Model definitions run by the engine (our own forward, weights from transformers)."""
