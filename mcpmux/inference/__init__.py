"""The in-process inference engine: continuous batching over a paged KV cache.

Layers, each importing only those listed before it: ``errors``; ``kernels`` (Triton + torch
reference); ``models`` (our forward, the loader and the builtin models); ``engine`` (scheduler, block
manager, model runner, sampler, the step loop and its async wrapper); ``serving`` (the service that
routes requests to local engines or a remote server, embeddings, the sampling bridge, the
``[inference]`` settings); ``openai`` (the OpenAI-compatible HTTP API). This package's ``__init__``
and those of ``engine``, ``serving`` and ``openai`` import nothing, so reading settings or sampling
parameters never imports torch.
"""
