"""The streamable HTTP front: the edge's checks, the fast path below ASGI, the dashboard, /v1 alone."""
