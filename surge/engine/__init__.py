"""The engine: LLMEngine (schedule / execute / update), the offline LLM, the engine process."""
