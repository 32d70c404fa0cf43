"""Attention, KV-write, norm and rotary kernels: Triton on CUDA, torch reference on CPU."""
