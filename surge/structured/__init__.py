"""Structured outputs: grammar-constrained decoding with xgrammar.

- :mod:`surge.structured.validate`: checks a :class:`~surge.sampling_params.StructuredOutputsParams`
  without a tokenizer (the API process answers a bad schema with a 400 before it reaches the
  engine).
- :mod:`surge.structured.compiler`: the engine's grammar compiler: tokenizer info built from the
  model folder's tokenizer, compilation in a thread pool off the engine loop, a cache by key.
- :mod:`surge.structured.manager`: the engine's per-request matchers, requests held back until
  their grammar is compiled, and the token bitmask of each step (:class:`GrammarBitmask`),
  which the sampler applies to the logits before sampling.

xgrammar (Dong et al., 2024, "XGrammar: Flexible and Efficient Structured Generation Engine
for Large Language Models", arXiv:2411.15100) is imported only when a request carries a grammar.
"""
