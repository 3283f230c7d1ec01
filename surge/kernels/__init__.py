"""Triton kernels of the GPU hot path: one kernel per file, each with a typed launcher."""
