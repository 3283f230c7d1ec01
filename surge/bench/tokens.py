"""Token counting for the benchmark: a local Hugging Face tokenizer, or the server's own ``/tokenize``.

Prompt lengths must be exact *as the server counts them*, so the default is to ask the server
(``POST /tokenize`` ``{"model", "prompt"}`` -> ``{"tokens", "count", "max_model_len"}`` and
``POST /detokenize`` ``{"model", "tokens"}`` -> ``{"prompt"}``, the vLLM/Surge API). A server counts a
completions prompt with the tokenizer's special tokens (e.g. a BOS), and so do both counters here.

Request fields of ``--extra-body`` that change the prompt's tokens (:data:`CHAT_PROMPT_FIELDS`,
e.g. ``chat_template_kwargs: {"enable_thinking": false}``, which makes Qwen3's template add an
empty think block) are counted as the server will apply them (:func:`prompt_options`): passed
to ``/tokenize`` (vLLM and Surge take the same field names there), or to the chat template of a
local tokenizer. A server whose ``/tokenize`` refuses one of them stops the run with one line
that says so and suggests ``--tokenizer DIR`` (Surge's ``/tokenize`` takes no ``tools``).
"""

from __future__ import annotations

import json
import os
import re
import ssl
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from surge.config import TOKENIZER_FILES
from surge.reasoning_effort import template_kwargs_with_effort

_BYTE_TOKEN = re.compile(r"^<0x[0-9A-Fa-f]{2}>$")


CHAT_PROMPT_FIELDS: dict[str, type] = {
    "chat_template": str,
    "chat_template_kwargs": dict,
    "add_generation_prompt": bool,
    "continue_final_message": bool,
    "add_special_tokens": bool,
    "tools": list,
}
"""Chat request fields that change the prompt's tokens, with their JSON type (Surge and vLLM)."""

COMPLETION_PROMPT_FIELDS: dict[str, type] = {"add_special_tokens": bool}
"""Completions request fields that change the prompt's tokens."""

_JSON_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", bool: "true or false"}


def prompt_options(extra_body: Mapping[str, Any] | None, chat: bool) -> dict[str, Any]:
    """The fields of ``--extra-body`` that change how the server tokenizes the prompt (for the
    chat endpoint :data:`CHAT_PROMPT_FIELDS`, else :data:`COMPLETION_PROMPT_FIELDS`); a field
    set to null is the server's default and left out. A chat ``reasoning_effort`` becomes the
    ``chat_template_kwargs`` the server renders with (``reasoning_effort``, and
    ``enable_thinking`` false for ``"none"``), which ``/tokenize`` takes.

    Raises:
        ValueError: such a field of the wrong JSON type (the server would refuse every request).
    """
    fields = CHAT_PROMPT_FIELDS if chat else COMPLETION_PROMPT_FIELDS
    out: dict[str, Any] = {}
    for name, kind in fields.items():
        value = (extra_body or {}).get(name)
        if value is None:
            continue
        if not isinstance(value, kind):
            raise ValueError(
                f"--extra-body: {name!r} must be {_JSON_TYPE_NAMES[kind]}, got {json.dumps(value)}"
            )
        out[name] = value
    effort = (extra_body or {}).get("reasoning_effort") if chat else None
    if effort is not None:
        # the chat template sees it as the server passes it (Surge and vLLM)
        if not isinstance(effort, str):
            raise ValueError(f"--extra-body: 'reasoning_effort' must be a string, got {json.dumps(effort)}")
        out["chat_template_kwargs"] = template_kwargs_with_effort(out.get("chat_template_kwargs"), effort)
    return out


class TokenCounter(Protocol):
    """What the datasets need: encode as the server counts, decode, and the ids to draw from."""

    name: str

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of ``text`` as a completions prompt (special tokens included unless
        ``add_special_tokens`` is False, the request field of that name)."""
        ...

    def encode_chat(self, text: str, options: Mapping[str, Any] | None = None) -> list[int]:
        """Token ids of a chat request with ``text`` as its single user message, as the server
        renders it (chat template and generation prompt included), under the request fields
        ``options`` (:data:`CHAT_PROMPT_FIELDS`, from :func:`prompt_options`)."""
        ...

    def decode(self, ids: list[int]) -> str:
        """Text of ``ids`` (special tokens skipped)."""
        ...

    def render_chat(self, text: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """The model's chat template rendered for ``text`` as the single user message, with the
        generation prompt and the template variables ``chat_template_kwargs`` (vLLM's
        ``--chat-template-kwargs``), as text (special tokens written out): what vLLM's benchmark
        sends as a completions prompt for its ``custom`` dataset.

        Raises:
            ValueError: the kwargs are refused (one line naming ``--chat-template-kwargs``).
        """
        ...

    def candidate_ids(self) -> np.ndarray:
        """int64 ``[n]``: the non-special vocabulary random prompts are drawn from."""
        ...


def is_tokenizer_dir(path: str | os.PathLike[str] | None) -> bool:
    """True when ``path`` is a local folder holding tokenizer files."""
    if not path:
        return False
    p = Path(path)
    return p.is_dir() and any((p / n).exists() for n in TOKENIZER_FILES)


def _vocab_pool(tok: Any) -> np.ndarray:
    """Non-special ids of an HF tokenizer, without byte-fallback pieces (``<0x0A>``)."""
    special = set(int(i) for i in tok.all_special_ids)
    special.update(int(i) for i in getattr(tok, "added_tokens_decoder", {}) or {})
    vocab: dict[str, int] = tok.get_vocab()
    ids = [i for piece, i in vocab.items() if i not in special and not _BYTE_TOKEN.match(piece)]
    return np.asarray(sorted(ids), dtype=np.int64)


class HFTokenCounter:
    """A local ``transformers.AutoTokenizer`` (loaded offline from a folder). Chat prompts are
    rendered with Surge's own template code (:func:`surge.tokenizer.apply_chat_template`).

    Raises:
        ValueError: the folder has no loadable tokenizer.
    """

    def __init__(self, path: str) -> None:
        from transformers import AutoTokenizer

        try:
            self.tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except Exception as e:
            first_line = str(e).strip().splitlines()[0] if str(e).strip() else ""  # one line on the CLI
            raise ValueError(
                f"cannot load a tokenizer from {path}: {type(e).__name__}: {first_line}"
            ) from None
        self.tok.model_max_length = 1 << 40  # we count long prompts on purpose; silence the length warning
        self.name = path
        self._pool: np.ndarray | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok(text, add_special_tokens=add_special_tokens)["input_ids"])

    def encode_chat(self, text: str, options: Mapping[str, Any] | None = None) -> list[int]:
        """Rendered by :func:`surge.tokenizer.apply_chat_template`, as Surge's server renders a
        chat request with these fields (without a server-side ``--chat-template``, which the
        benchmark cannot see, and under its default ``--chat-template-content-format auto``, so
        a ``chat_template`` of ``--extra-body`` that loops over content parts gets one; count
        with the server's ``/tokenize`` for another).

        Raises:
            ValueError: the template refuses the options (one line).
        """
        from surge.tokenizer import apply_chat_template

        opts = dict(options or {})
        try:
            return apply_chat_template(
                self.tok,
                [{"role": "user", "content": text}],
                add_generation_prompt=opts.get("add_generation_prompt", True),
                chat_template=opts.get("chat_template"),
                chat_template_kwargs=opts.get("chat_template_kwargs"),
                tools=opts.get("tools"),
                continue_final_message=opts.get("continue_final_message", False),
                add_special_tokens=opts.get("add_special_tokens"),
                content_format="auto",
            )
        except ValueError as e:
            if not opts:
                raise
            raise ValueError(f"--extra-body ({', '.join(sorted(opts))}): {e}") from None

    def decode(self, ids: list[int]) -> str:
        return str(self.tok.decode(ids, skip_special_tokens=True))

    def render_chat(self, text: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """Rendered by :func:`surge.tokenizer.apply_chat_template` (the text it tokenizes)."""
        from surge.tokenizer import apply_chat_template

        rendered: list[str] = []
        try:
            apply_chat_template(
                self.tok,
                [{"role": "user", "content": text}],
                chat_template_kwargs=chat_template_kwargs,
                check_text=rendered.append,
            )
        except ValueError as e:
            if chat_template_kwargs is None:
                raise
            raise ValueError(f"--chat-template-kwargs: {e}") from None
        return rendered[0]

    def candidate_ids(self) -> np.ndarray:
        if self._pool is None:
            self._pool = _vocab_pool(self.tok)
        return self._pool


def tls_context(insecure: bool) -> ssl.SSLContext | None:
    """The TLS context of the benchmark's ``urllib`` requests: None (the default, which verifies
    an https server's certificate and host name) or, with vLLM's ``--insecure``, one that checks
    neither (a server with a self-signed certificate)."""
    if not insecure:
        return None
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    return ctx


def request_headers(
    api_key: str | None, extra: Sequence[tuple[str, str]] = (), content_type: str | None = None
) -> dict[str, str]:
    """The HTTP headers of a call to the server, as vLLM 0.26's client sets them: ``Content-Type``
    (when given) and ``Authorization: Bearer KEY`` (when ``api_key``), then vLLM's ``--header``
    pairs ``extra``, which replace a header of the same name (names compare case-insensitively)."""
    headers: dict[str, str] = {}
    if content_type:
        headers["Content-Type"] = content_type
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    for name, value in extra:
        for old in [k for k in headers if k.lower() == name.lower()]:
            del headers[old]
        headers[name] = value
    return headers


def post_json(
    url: str,
    body: dict[str, Any],
    api_key: str | None = None,
    timeout: float = 60.0,
    insecure: bool = False,
    headers: Sequence[tuple[str, str]] = (),
) -> Any:
    """POST JSON and return the decoded JSON answer (``insecure``: :func:`tls_context`; ``headers``:
    vLLM's ``--header`` pairs, as :func:`request_headers`).

    Raises:
        OSError: network trouble or a non-2xx status (``urllib.error.HTTPError`` is an ``OSError``).
    """
    sent = request_headers(api_key, headers, "application/json")
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=sent, method="POST")
    with urllib.request.urlopen(req, timeout=timeout, context=tls_context(insecure)) as resp:
        return json.loads(resp.read())


def get_json(
    url: str,
    api_key: str | None = None,
    timeout: float = 30.0,
    insecure: bool = False,
    headers: Sequence[tuple[str, str]] = (),
) -> Any:
    """GET and decode JSON (``insecure``: :func:`tls_context`; ``headers``: vLLM's ``--header``
    pairs, as :func:`request_headers`). Raises ``OSError`` on network trouble or a non-2xx status."""
    req = urllib.request.Request(url, headers=request_headers(api_key, headers))
    with urllib.request.urlopen(req, timeout=timeout, context=tls_context(insecure)) as resp:
        return json.loads(resp.read())


class ServerTokenCounter:
    """Counts with the server's ``/tokenize`` and ``/detokenize`` (exactly the server's view);
    chat prompts with ``/tokenize`` of ``messages`` (vLLM and Surge render them as chat does).

    ``pool`` is the vocabulary to draw from: a local tokenizer's when one is known, otherwise the
    distinct ids the server gives for a fixed pseudo-random ASCII text (documented fallback).
    ``insecure``: skip the TLS certificate check (vLLM's ``--insecure``, :func:`tls_context`).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        api_key: str | None = None,
        pool: np.ndarray | None = None,
        insecure: bool = False,
        headers: Sequence[tuple[str, str]] = (),
    ):
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.api_key = api_key
        self.insecure = insecure
        self.headers = tuple(headers)
        self.name = f"{self.base_url}/tokenize"
        self._pool = pool
        self.max_model_len: int | None = None

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """``/tokenize`` of ``text`` as a completions prompt; remembers the ``max_model_len`` the
        server reports.

        Raises:
            ValueError: the server refused ``add_special_tokens`` or answered no token ids.
            OSError: the request failed (as :func:`post_json`).
        """
        options = {} if add_special_tokens else {"add_special_tokens": False}
        ans = self._tokenize({"model": self.model, "prompt": text, **options}, options)
        ids = token_ids(ans, "/tokenize")
        self.max_model_len = max_model_len_of(ans, "/tokenize") or self.max_model_len
        return ids

    def encode_chat(self, text: str, options: Mapping[str, Any] | None = None) -> list[int]:
        """``/tokenize`` of the chat request, with the request fields ``options`` sent as they
        are (``/tokenize`` takes the chat request's names).

        Raises:
            ValueError: the server refused the options (one line naming them).
        """
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "add_generation_prompt": True,
            **(options or {}),
        }
        return token_ids(self._tokenize(body, options or {}), "/tokenize")

    def _tokenize(self, body: dict[str, Any], options: Mapping[str, Any]) -> Any:
        """``POST /tokenize``. A refusal (4xx) is a ValueError with the server's message: of the
        prompt fields ``options`` when the body carries them, else of the prompt (e.g. a dataset's
        text holding a lone surrogate escape, which the server refuses as vLLM's tokenizer would
        fail on it), whose start it quotes; other failures stay ``OSError`` (the server went away)."""
        try:
            return post_json(
                f"{self.base_url}/tokenize", body, self.api_key, insecure=self.insecure, headers=self.headers
            )
        except urllib.error.HTTPError as e:
            if not 400 <= e.code < 500:
                raise
            detail = _error_text(e)
            if not options:
                messages = body.get("messages")
                text = messages[0]["content"] if messages else body.get("prompt")
                raise ValueError(
                    f"the server's /tokenize refused the prompt {json.dumps(text)[:80]}: HTTP {e.code}: {detail}"
                ) from None
            raise ValueError(
                f"the server's /tokenize refused the prompt fields of --extra-body "
                f"({', '.join(sorted(options))}), so the prompts cannot be counted as the server will "
                f"see them: HTTP {e.code}: {detail}; pass --tokenizer DIR to count them with a local "
                "tokenizer, or drop the fields"
            ) from None

    def decode(self, ids: list[int]) -> str:
        """``/detokenize`` of ``ids``.

        Raises:
            ValueError: the answer has no ``prompt`` text.
            OSError: the request failed (as :func:`post_json`).
        """
        ans = post_json(
            f"{self.base_url}/detokenize",
            {"model": self.model, "tokens": ids},
            self.api_key,
            insecure=self.insecure,
            headers=self.headers,
        )
        prompt = ans.get("prompt") if isinstance(ans, dict) else None
        if not isinstance(prompt, str):
            raise ValueError(f"the server's /detokenize answered no prompt text: {_excerpt(ans)}")
        return prompt

    def render_chat(self, text: str, chat_template_kwargs: Mapping[str, Any] | None = None) -> str:
        """``/detokenize`` of the chat prompt's ``/tokenize`` ids (Surge's and vLLM's
        ``/detokenize`` write special tokens out)."""
        if chat_template_kwargs is None:
            return self.decode(self.encode_chat(text))
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": text}],
            "add_generation_prompt": True,
            "chat_template_kwargs": dict(chat_template_kwargs),
        }
        try:
            ans = post_json(
                f"{self.base_url}/tokenize", body, self.api_key, insecure=self.insecure, headers=self.headers
            )
        except urllib.error.HTTPError as e:
            if not 400 <= e.code < 500:
                raise
            raise ValueError(
                f"--chat-template-kwargs: the server's /tokenize refused them: HTTP {e.code}: {_error_text(e)}"
            ) from None
        return self.decode(token_ids(ans, "/tokenize"))

    def candidate_ids(self) -> np.ndarray:
        if self._pool is None:
            rng = np.random.default_rng(12345)
            letters = np.array(list("abcdefghijklmnopqrstuvwxyz"))
            words = ["".join(rng.choice(letters, size=int(rng.integers(2, 9)))) for _ in range(2000)]
            ids = set(self.encode(" ".join(words)))
            ids.difference_update(self.encode(""))  # BOS or other added specials
            self._pool = np.asarray(sorted(ids), dtype=np.int64)
        return self._pool


def _excerpt(value: Any) -> str:
    """``value`` as JSON text, cut to 200 characters (for an error message)."""
    return json.dumps(value)[:200]


def token_ids(ans: Any, where: str) -> list[int]:
    """The ``tokens`` of a ``/tokenize`` answer ``ans`` from ``where``.

    Raises:
        ValueError: no list of token ids (non-negative integers) there, with the answer's start.
    """
    tokens = ans.get("tokens") if isinstance(ans, dict) else None
    if not isinstance(tokens, list) or not all(type(t) is int and t >= 0 for t in tokens):
        raise ValueError(f"the server's {where} answered no list of token ids: {_excerpt(ans)}")
    return tokens


def max_model_len_of(ans: Any, where: str) -> int | None:
    """The ``max_model_len`` of a server's answer ``ans`` (a ``/tokenize`` answer or a
    ``/v1/models`` entry) from ``where``, None when it gives none.

    Raises:
        ValueError: a ``max_model_len`` that is not a positive integer.
    """
    value = ans.get("max_model_len") if isinstance(ans, dict) else None
    if value is None:
        return None
    if type(value) is not int or value < 1:
        raise ValueError(
            f"the server's {where} gives a max_model_len that is not a token count: {_excerpt(value)}"
        )
    return value


def _error_text(e: urllib.error.HTTPError) -> str:
    """The message of an HTTP error's OpenAI-style JSON body, else its first line or reason."""
    try:
        body = e.read().decode("utf-8", "replace")
    except OSError:
        body = ""
    try:
        data = json.loads(body)
        err = data.get("error", data) if isinstance(data, dict) else data
        message = err.get("message") or err.get("detail") if isinstance(err, dict) else None
        if message:
            return str(message).splitlines()[0]
    except (ValueError, AttributeError):
        pass
    return (body.strip().splitlines() or [str(e.reason)])[0][:300]


def server_tokenize_works(
    base_url: str,
    model: str,
    api_key: str | None = None,
    insecure: bool = False,
    headers: Sequence[tuple[str, str]] = (),
) -> bool:
    """True when ``POST {base_url}/tokenize`` answers with a token list."""
    try:
        ans = post_json(
            f"{base_url.rstrip('/')}/tokenize",
            {"model": model, "prompt": "hello"},
            api_key,
            10.0,
            insecure,
            headers,
        )
        return isinstance(ans, dict) and isinstance(ans.get("tokens"), list)
    except (OSError, ValueError):
        return False


def resolve_counter(
    base_url: str,
    model: str,
    tokenizer: str | None,
    model_root: str | None,
    api_key: str | None = None,
    insecure: bool = False,
    headers: Sequence[tuple[str, str]] = (),
) -> TokenCounter:
    """Pick the token counter: ``--tokenizer DIR``, else the server's ``/tokenize`` (called with
    ``headers``, vLLM's ``--header`` pairs), else a local folder.

    Args:
        model_root: a local model folder if one is known (``--model`` when it is a folder, or the
            ``root`` of the server's ``/v1/models`` entry); used for the vocabulary and as fallback.
    Raises:
        ValueError: no way to count tokens.
    """
    if tokenizer:
        if not Path(tokenizer).is_dir():
            raise ValueError(f"--tokenizer {tokenizer}: not a folder")
        if not is_tokenizer_dir(tokenizer):
            raise ValueError(
                f"--tokenizer {tokenizer}: the folder has no tokenizer files ({', '.join(TOKENIZER_FILES)})"
            )
        print(f"[bench] loading the tokenizer of {tokenizer} to count prompt tokens", flush=True)
        return HFTokenCounter(tokenizer)
    local = model_root if is_tokenizer_dir(model_root) else None
    if server_tokenize_works(base_url, model, api_key, insecure, headers):
        print(f"[bench] counting prompt tokens with the server's {base_url.rstrip('/')}/tokenize", flush=True)
        pool = None
        if local:
            print(f"[bench] loading the tokenizer of {local} for its vocabulary", flush=True)
            pool = HFTokenCounter(local).candidate_ids()
        return ServerTokenCounter(base_url, model, api_key, pool, insecure, headers)
    if local:
        print(f"[bench] the server has no /tokenize: loading the tokenizer of {local}", flush=True)
        return HFTokenCounter(local)
    raise ValueError(
        "cannot count tokens: the server has no /tokenize and no local tokenizer is known; pass --tokenizer DIR"
    )
