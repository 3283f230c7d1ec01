"""Pure-Python engine core: scheduler, KV cache manager and the types they exchange (no torch)."""
