import time, numpy as np
from concurrent.futures import ThreadPoolExecutor
from transformers import AutoTokenizer
tok = AutoTokenizer.from_pretrained(".assets/qwen3-8b")
rng = np.random.default_rng(0)
texts = [tok.decode(rng.integers(1000, 150000, 250).tolist()) for _ in range(64)]
r = tok._tokenizer
for name, fn in [("tok.encode", lambda t: tok.encode(t, add_special_tokens=False)), ("rust encode", lambda t: r.encode(t, add_special_tokens=False).ids), ("rust encode_batch1", lambda t: r.encode_batch([t], add_special_tokens=False)[0].ids)]:
    for th in (1, 2, 4):
        with ThreadPoolExecutor(th) as ex:
            list(ex.map(fn, texts))
            t0 = time.perf_counter()
            list(ex.map(fn, texts))
            print(name, th, "threads: %.1f ms for 64" % ((time.perf_counter() - t0) * 1e3))
t0=time.perf_counter(); r.encode_batch(texts, add_special_tokens=False); print("encode_batch(64) %.1f ms" % ((time.perf_counter()-t0)*1e3))
