"""The stdio front: one client on this process's stdin and stdout (batch arrays, the fast path)."""
