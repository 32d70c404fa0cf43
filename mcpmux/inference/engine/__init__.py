"""The continuous-batching engine: scheduler, paged block manager, model runner, sampler, step loop."""
