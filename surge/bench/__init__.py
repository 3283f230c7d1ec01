"""Serving benchmark: `surge bench serve | matrix | compare | roofline` (vLLM bench serve metrics)."""
