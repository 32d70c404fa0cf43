"""OAuth 2.1 for HTTP upstreams: the token store, the bearer auth `serve` sends, and `mcpmux login`'s flow."""
