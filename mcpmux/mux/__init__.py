"""The multiplexer: `Mux`, its catalog, the executor of calls (dispatcher, fast path), reload."""
