"""The in-process inference engine: continuous batching over a paged KV cache."""
