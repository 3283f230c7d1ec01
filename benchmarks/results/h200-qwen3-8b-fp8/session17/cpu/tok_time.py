import time, numpy as np
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(".assets/qwen3-8b")
rng = np.random.default_rng(0)
ids = rng.integers(1000, 150000, 250).tolist()
text = tok.decode(ids)
print(len(text), repr(text[:200]))
eng = "The quick brown fox jumps over the lazy dog. " * 25
for name, t in [("random", text), ("english", eng)]:
    for f, fn in [("tok.encode", lambda: tok.encode(t, add_special_tokens=False)), ("rust encode", lambda: tok._tokenizer.encode(t, add_special_tokens=False).ids), ("rust encode_batch", lambda: tok._tokenizer.encode_batch([t], add_special_tokens=False)[0].ids)]:
        fn()
        t0=time.perf_counter(); n=50
        for _ in range(n): r=fn()
        print(name, f, len(r), "%.1f us" % ((time.perf_counter()-t0)/n*1e6))
