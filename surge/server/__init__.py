"""The OpenAI-compatible HTTP server (`surge serve`): FastAPI app, endpoints, metrics."""
