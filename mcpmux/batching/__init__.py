"""Generic batching and scheduling of items under a policy. Knows nothing of MCP or torch."""
