"""Bytes <-> JSON-RPC: compact JSON, stdio lines, HTTP/1.1 responses, inbound batch arrays."""
