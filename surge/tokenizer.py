"""Tokenizer loading, chat templates and incremental (streaming) detokenization.

All of this runs in the API process; the engine only ever sees token ids.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from transformers import AutoTokenizer, PreTrainedTokenizerBase

from surge.chat_content_format import ContentFormat, resolve_content_format
from surge.config import TOKENIZER_FILES
from surge.parallel_encode import encode_text
from surge.stop_strings import StopAutomaton

if TYPE_CHECKING:
    from surge.sampling_params import SamplingParams

_REPLACEMENT_CHAR = "\ufffd"
_INITIAL_PREFIX_TOKENS = 5
"""Prompt tokens decoded as left context of the first output token (vLLM uses 5)."""
_TRIM_TOKENS = 1024
"""Drop decoded ids from the detokenizer's buffer once this many lie before the window."""
_HELD_TOKENS = 8
"""Held tokens (an incomplete character) decoded again at every token; a UTF-8 character has at
most 4 bytes, so a longer window holds bytes that form no character (see ``_decode_new``)."""
RESERVED_TEMPLATE_KWARGS = frozenset(
    {
        # what the template is rendered with (transformers' render_jinja_template)
        "messages",
        "tools",
        "documents",
        "add_generation_prompt",
        # the named parameters of apply_chat_template and render_jinja_template: a template
        # variable of one of these names would set the parameter instead
        "conversation",
        "conversations",
        "chat_template",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
"""Names ``chat_template_kwargs`` must not set: :func:`apply_chat_template` passes them itself
(from the request's own fields), so a template variable of that name would clash with them."""


def check_chat_template_kwargs(chat_template_kwargs: Mapping[str, Any] | None) -> None:
    """Refuse template variables that :func:`apply_chat_template` passes itself.

    Raises:
        ValueError: ``chat_template_kwargs`` is not a mapping of string names (the offline
            ``LLM.chat`` takes any object; a string failed as "dictionary update sequence
            element #0 has length 1"), or sets a name of :data:`RESERVED_TEMPLATE_KWARGS` (the
            message names them all).
    """
    if chat_template_kwargs is None:
        return
    if not isinstance(chat_template_kwargs, Mapping) or not all(
        isinstance(k, str) for k in chat_template_kwargs
    ):
        raise ValueError(
            "chat_template_kwargs must be a dict of template variable names to values, e.g. "
            f'{{"enable_thinking": False}}, got {type(chat_template_kwargs).__name__} {chat_template_kwargs!r:.80}'
        )
    bad = sorted(RESERVED_TEMPLATE_KWARGS.intersection(chat_template_kwargs))
    if bad:
        raise ValueError(
            f"chat_template_kwargs must not set {', '.join(bad)}: Surge passes "
            f"{'that name' if len(bad) == 1 else 'those names'} to the chat template itself "
            f"(reserved: {', '.join(sorted(RESERVED_TEMPLATE_KWARGS))})"
        )


FALLBACK_CHAT_TEMPLATE_DOC = (
    "Without a chat template, messages are rendered as one line per message, "
    '"<role>: <content>\\n", followed by "assistant:" when add_generation_prompt is true, '
    "and encoded with the tokenizer's special tokens (e.g. BOS) unless add_special_tokens is false. "
    "Tools, when given, come first "
    'as one line "tools: <the tools as JSON>\\n".'
)


_PROBE_TEXT = "Hello world"
"""Text every working tokenizer encodes to at least one token (checked at load)."""


def has_tokenizer_files(model_dir: str | Path) -> bool:
    """Whether ``model_dir`` holds one of :data:`TOKENIZER_FILES`."""
    return any((Path(model_dir) / f).is_file() for f in TOKENIZER_FILES)


class InvalidModelConfigError(ValueError):
    """A model folder's config.json that transformers refuses (a field's type or value), found
    while it loads the tokenizer, which reads config.json too."""


def _is_config_validation_error(e: BaseException) -> bool:
    """Whether ``e`` is transformers' check of a config.json field or of the whole config
    (huggingface_hub's strict dataclasses; not their definition errors, which are bugs)."""
    try:
        from huggingface_hub.errors import (
            StrictDataclassClassValidationError,
            StrictDataclassFieldValidationError,
        )
    except ImportError:  # an older huggingface_hub: transformers 4 configs are not strict dataclasses
        return False
    return isinstance(e, StrictDataclassClassValidationError | StrictDataclassFieldValidationError)


def error_reason(e: BaseException) -> str:
    """An exception's message on one line: its first line, and the lines after it while a line
    ends with a colon (transformers' "Class validation error for validator 'x':" states its
    reason on the next line); the exception's type name when it has no message."""
    lines = [line.strip() for line in str(e).strip().splitlines() if line.strip()]
    if not lines:
        return type(e).__name__
    out = [lines[0]]
    for line in lines[1:]:
        if not out[-1].endswith(":"):
            break
        out.append(line)
    return " ".join(out)


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """Load the tokenizer of a Hugging Face model folder from local files only.

    Args:
        model_dir: the model folder (tokenizer.json / tokenizer_config.json ...).

    Returns:
        The transformers tokenizer (never reads the network: ``local_files_only=True``).

    Raises:
        InvalidModelConfigError: its config.json fails transformers' checks (a ValueError).
        ValueError: the folder does not exist or holds no loadable tokenizer, or its vocabulary
            files (:data:`~surge.config.TOKENIZER_FILES`) load as a tokenizer that encodes text
            to no tokens. A folder without any of them may load as an empty tokenizer (the
            offline ``LLM`` then takes token-id prompts only; ``surge serve`` refuses such a
            folder before loading it).
    """
    path = Path(model_dir)
    if not path.is_dir():
        raise ValueError(f"tokenizer: {str(path)!r} is not a directory")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    except Exception as e:  # transformers raises OSError, ValueError, KeyError, ...
        reason = error_reason(e)
        if _is_config_validation_error(e):
            raise InvalidModelConfigError(f"model: {str(path / 'config.json')!r} is invalid: {reason}") from e
        raise ValueError(f"tokenizer: cannot load a tokenizer from {str(path)!r}: {reason}") from e
    if has_tokenizer_files(path) and not tokenizer.encode(_PROBE_TEXT, add_special_tokens=False):
        # a tokenizer that drops every text: prompts would reach the model as their special tokens
        raise ValueError(
            f"tokenizer: the tokenizer of {str(path)!r} encodes text to no tokens: its vocabulary "
            "files are incomplete or empty; copy the model's tokenizer files into the folder"
        )
    # The engine, not the tokenizer, decides what fits (max_model_len); without this,
    # transformers warns on every prompt longer than the tokenizer's own model_max_length.
    tokenizer.model_max_length = 1 << 62
    return tokenizer


TEXT_PART_KEYS = {
    "text": "text",
    "input_text": "text",
    "output_text": "text",
    "refusal": "refusal",
    "thinking": "thinking",
}
"""The content part types read as text, and the key holding each one's text, as vLLM reads
them: OpenAI's ``text`` and ``refusal`` (an assistant message replayed from an OpenAI
conversation may carry one), the Responses API's ``input_text`` / ``output_text``, and
``thinking``."""


def _text_parts(content: Sequence[Any], where: str) -> list[tuple[str, Mapping[str, Any]]]:
    """Each part of a list ``content`` as ``(its text, the part)``; ``where`` names the message
    in errors (``messages[2]``).

    Raises:
        ValueError: a part of another type (images, audio: not supported), or a text part
            without a string under its key; the message names the part and its type.
    """
    out: list[tuple[str, Mapping[str, Any]]] = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, Mapping) else None
        key = TEXT_PART_KEYS.get(kind) if isinstance(kind, str) else None
        if key is None:
            if not isinstance(part, Mapping):
                found = "is not an object"
            elif kind is None:
                found = "has no 'type'"
            else:
                found = f"has type {kind!r}"
            raise ValueError(
                f"{where}.content[{j}] {found}: only text content parts (of type 'text', 'refusal', "
                "'input_text', 'output_text' or 'thinking') are supported"
            )
        text = part.get(key)
        if not isinstance(text, str):
            raise ValueError(f"{where}.content[{j}]: a content part of type {kind!r} needs a string {key!r}")
        out.append((text, part))
    return out


def content_text(content: Any, where: str = "messages[i]") -> str:
    """A message's content as one string: a string, or the text parts of a list
    (:data:`TEXT_PART_KEYS`) joined by newlines. ``where`` names the message in errors.

    Raises:
        ValueError: a part of another type (images, audio: not supported), or a text part
            without a string under its key.
    """
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence):
        return "\n".join(text for text, _ in _text_parts(content, where))
    raise ValueError(f"{where}.content must be a string or a list of text parts")


def content_parts(content: Any, where: str = "messages[i]") -> list[dict[str, Any]]:
    """A message's content as OpenAI's list of parts, as vLLM's ``openai`` content format passes
    it to a chat template: each text part (:data:`TEXT_PART_KEYS`) as ``{"type": "text", "text":
    ...}`` with the part's other keys (e.g. ``cache_control``), a string as one such part, no
    content as ``[]``.

    Raises:
        ValueError: as :func:`content_text`.
    """
    if content is None:
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, Sequence):
        return [
            {
                "type": "text",
                "text": text,
                **{k: v for k, v in part.items() if k not in ("type", "text", TEXT_PART_KEYS[part["type"]])},
            }
            for text, part in _text_parts(content, where)
        ]
    raise ValueError(f"{where}.content must be a string or a list of text parts")


_REASONING_KEYS = ("reasoning_content", "reasoning")
"""A chat message's reasoning: the name templates read first, then vLLM's."""


_GENERATION_TAG = re.compile(r"\{%-?\s*generation\s*-?%\}")
"""A chat template's ``{% generation %}`` tag, which marks the assistant's text (transformers'
``return_assistant_tokens_mask``)."""


def resolve_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str | None:
    """The template text a chat is rendered with: ``chat_template`` when given, else the
    tokenizer's (None: it has none). A tokenizer of named templates (its ``chat_template`` a
    dict, e.g. Hermes 2 Pro's ``default`` and ``tool_use``) gives the one transformers'
    ``get_chat_template`` picks, as vLLM's ``resolve_chat_template``: ``tool_use`` for a chat
    with ``tools`` when it has one, else ``default``.

    Raises:
        ValueError: named templates without the one to use (no ``default``), in one line
            starting "chat template: ".
    """
    if chat_template is not None:
        return chat_template
    template = tokenizer.chat_template
    if not isinstance(template, Mapping):
        return template
    try:
        return str(tokenizer.get_chat_template(None, list(tools) if tools else None))
    except ValueError as e:
        raise ValueError(f"chat template: {' '.join(str(e).split())}") from e


def described_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    chat_template: str | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
) -> str | None:
    """:func:`resolve_chat_template`'s template, or None where named templates lack the one to
    use (each chat's rendering then says so): the template the content format's log line of the
    server and of ``LLM.chat`` describes (:func:`surge.chat_content_format.describe_content_format`)."""
    try:
        return resolve_chat_template(tokenizer, chat_template, tools)
    except ValueError:
        return None


def chat_adds_special_tokens(template: str | None, add_special_tokens: bool | None) -> bool:
    """Whether :func:`apply_chat_template` encodes the rendered text with the tokenizer's special
    tokens (e.g. BOS): a template writes its own, so only when ``add_special_tokens`` is true; the
    fallback rendering of a tokenizer without a template (``template`` None or empty) writes none,
    so unless it is false."""
    return bool(add_special_tokens) if template else add_special_tokens is not False


def normalize_messages(
    messages: Sequence[Mapping[str, Any]], content_format: ContentFormat = "string"
) -> list[dict[str, Any]]:
    """Copy chat messages with every ``content`` in ``content_format``: one string
    (:func:`content_text`), or under ``openai`` a list of text parts (:func:`content_parts`),
    except a ``tool`` message's, which stays one string (as vLLM passes it: clients send tool
    results as parts, templates read them as strings); and a message's reasoning under both of
    its names: a string ``reasoning`` (vLLM's name, which clients
    written for vLLM send back in the history) fills a ``reasoning_content`` that is not a
    string (the name chat templates such as Qwen3's read), and ``reasoning_content`` fills
    ``reasoning``, as vLLM passes them; whatever transformers version renders the template.

    Raises:
        ValueError: a message is not a mapping with a string ``role``, or has non-text content.
    """
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with a string 'role'")
        msg = dict(m)
        if content_format == "openai" and m["role"] != "tool":
            msg["content"] = content_parts(m.get("content"), f"messages[{i}]")
        else:
            msg["content"] = content_text(m.get("content"), f"messages[{i}]")
        reasoning = next((m[k] for k in _REASONING_KEYS if isinstance(m.get(k), str)), None)
        if reasoning is not None:
            msg.update(dict.fromkeys(_REASONING_KEYS, reasoning))
        if msg.get("tool_calls"):
            msg["tool_calls"] = _template_tool_calls(msg["tool_calls"], i)
        out.append(msg)
    return out


def _template_tool_calls(calls: Any, index: int) -> list[dict[str, Any]]:
    """An assistant message's OpenAI ``tool_calls`` with each ``function.arguments`` JSON
    string parsed into an object, as chat templates expect (Llama 3's writes it with tojson).

    Raises:
        ValueError: a call is not an object with a ``function`` name, or its arguments are
            not JSON.
    """
    import json

    if not isinstance(calls, list):
        raise ValueError(f"messages[{index}].tool_calls must be a list")
    out: list[dict[str, Any]] = []
    for call in calls:
        fn = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
            raise ValueError(f"messages[{index}].tool_calls: each call needs a function with a name")
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except RecursionError:
                raise ValueError(
                    f"messages[{index}].tool_calls: arguments are nested too deeply to parse as JSON"
                ) from None
            except ValueError as e:
                raise ValueError(f"messages[{index}].tool_calls: arguments are not valid JSON: {e}") from e
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def apply_chat_template(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    *,
    add_generation_prompt: bool = True,
    chat_template: str | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    check_text: Callable[[str], None] | None = None,
    tools: Sequence[Mapping[str, Any]] | None = None,
    continue_final_message: bool = False,
    add_special_tokens: bool | None = None,
    splittable: bool | None = None,
    documents: Sequence[Mapping[str, Any]] | None = None,
    on_generation_spans: Callable[[list[tuple[int, int]]], None] | None = None,
    content_format: str = "string",
) -> list[int]:
    """Render chat messages with the model's chat template and tokenize them.

    The template (``chat_template`` if given, else the tokenizer's) is rendered to text
    and encoded without adding special tokens (the template writes its own, as vLLM does)
    unless ``add_special_tokens``. A tokenizer without a template uses the fallback
    described by ``FALLBACK_CHAT_TEMPLATE_DOC``, which adds them unless ``add_special_tokens``
    is False.

    Args:
        tokenizer: the tokenizer.
        messages: ``[{"role": ..., "content": str | [{"type": "text", "text": ...}]}, ...]``;
            a ``developer`` message is rendered as ``system`` by a template that does not name
            the developer role (OpenAI's newer name for system instructions).
        add_generation_prompt: end with the assistant turn header.
        chat_template: a Jinja template overriding the tokenizer's (whose named templates, if it
            has several, give one by ``tools``: :func:`resolve_chat_template`).
        chat_template_kwargs: extra template variables, e.g. ``{"enable_thinking": False}``.
        check_text: called with the rendered text before it is tokenized (may raise).
        tools: OpenAI function definitions the template renders (``tools`` of Qwen3's and
            Llama 3's templates).
        continue_final_message: leave the last message open (no end-of-turn after it), so the
            model continues it (transformers' ``continue_final_message``).
        add_special_tokens: add the tokenizer's special tokens (e.g. BOS) when encoding the
            rendered text: True / False, or None for the default (no for a template, which
            writes its own; yes for the fallback, which writes none).
        splittable: :func:`surge.parallel_encode.split_safe` of ``tokenizer`` if the caller
            computed it once, else None (checked here for a long text).
        documents: vLLM's RAG ``documents`` (dicts, e.g. ``title`` and ``text``), passed to the
            template as ``documents`` (templates that do not read them render as without);
            the fallback rendering of a model without a template lists them first.
        on_generation_spans: called with the character spans ``(start, end)`` of the rendered
            text that the template's ``{% generation %}`` blocks wrote (the assistant's text),
            in order, only for a template that has such tags, under ``continue_final_message``
            false (transformers refuses the two together) and when a second rendering that
            records the spans gives the same text; never called otherwise.
        content_format: how each message's content reaches the template: vLLM's ``string``
            (one string, text parts joined by newlines), ``openai`` (a list of
            ``{"type": "text", "text": ...}`` parts) or ``auto`` (the template's own, detected
            once per template: :mod:`surge.chat_content_format`). The fallback rendering of a
            tokenizer without a template always writes strings.

    Returns:
        The prompt token ids.

    Raises:
        ValueError: no messages, malformed messages, reserved kwargs, named templates without
            the one to use, an unknown
            ``content_format``, or a template error.
    """
    if not messages:
        raise ValueError("messages must not be empty")
    template = resolve_chat_template(tokenizer, chat_template, tools)
    fmt = resolve_content_format(content_format, template)
    msgs = normalize_messages(messages, fmt if template else "string")
    check_chat_template_kwargs(chat_template_kwargs)
    kwargs = dict(chat_template_kwargs or {})
    if template and "developer" not in template:
        # OpenAI's "developer" role is its newer name for "system"; a template that does not know
        # it (Qwen3's renders only system, user, assistant and tool) would drop the message
        msgs = [{**m, "role": "system"} if m.get("role") == "developer" else m for m in msgs]
    if continue_final_message and add_generation_prompt:
        raise ValueError("continue_final_message and add_generation_prompt cannot both be true")
    if not template:
        lines = [f"{m['role']}: {m['content']}\n" for m in msgs]
        if tools or documents:
            import json

            if documents:
                lines.insert(0, f"documents: {json.dumps(list(documents), ensure_ascii=False)}\n")
            if tools:
                lines.insert(0, f"tools: {json.dumps(list(tools), ensure_ascii=False)}\n")
        if continue_final_message:
            lines[-1] = lines[-1][:-1]
        if add_generation_prompt:
            lines.append("assistant:")
        text = "".join(lines)
        if check_text is not None:
            check_text(text)
        return encode_text(
            tokenizer, text, chat_adds_special_tokens(template, add_special_tokens), splittable=splittable
        )
    try:
        text = tokenizer.apply_chat_template(
            msgs,
            chat_template=template,
            add_generation_prompt=add_generation_prompt,
            continue_final_message=continue_final_message,
            tokenize=False,
            tools=list(tools) if tools else None,
            documents=list(documents) if documents else None,
            **kwargs,
        )
    except Exception as e:  # jinja2 TemplateError, TypeError from user kwargs, ...
        raise ValueError(f"chat template error: {e}") from e
    if not isinstance(text, str):
        raise ValueError("chat template did not render to a string")
    if check_text is not None:
        check_text(text)
    if on_generation_spans is not None and not continue_final_message and _GENERATION_TAG.search(template):
        spans = _generation_spans(
            tokenizer,
            msgs,
            template,
            text,
            add_generation_prompt=add_generation_prompt,
            tools=tools,
            kwargs=kwargs,
        )
        if spans is not None:
            on_generation_spans(spans)
    return encode_text(
        tokenizer, text, chat_adds_special_tokens(template, add_special_tokens), splittable=splittable
    )


def _generation_spans(
    tokenizer: PreTrainedTokenizerBase,
    msgs: list[dict[str, Any]],
    template: str,
    text: str,
    *,
    add_generation_prompt: bool,
    tools: Sequence[Mapping[str, Any]] | None,
    kwargs: Mapping[str, Any],
) -> list[tuple[int, int]] | None:
    """The ``{% generation %}`` spans of ``template`` rendered over ``msgs`` (transformers'
    ``render_jinja_template``, with the variables ``tokenizer.apply_chat_template`` passes), or
    None when that rendering fails or differs from ``text``."""
    from transformers.utils.chat_template_utils import render_jinja_template

    try:
        rendered, indices = render_jinja_template(
            conversations=[msgs],
            tools=list(tools) if tools else None,
            chat_template=template,
            return_assistant_tokens_mask=True,
            add_generation_prompt=add_generation_prompt,
            **{**tokenizer.special_tokens_map, **kwargs},
        )
    except Exception:  # the plain rendering succeeded: no mask rather than a failed request
        return None
    if rendered[0] != text:
        return None
    return [(int(start), int(end)) for start, end in indices[0]]


def bad_words_token_ids(
    tokenizer: PreTrainedTokenizerBase, words: Sequence[str]
) -> tuple[tuple[int, ...], ...]:
    """The token sequences of vLLM's ``bad_words``: each word (leading spaces stripped) encoded
    without special tokens at the start of a text and after a space, so that it is banned both
    where it starts the output and in the middle of a sentence; duplicates dropped.

    vLLM keeps the after-a-space encoding only when it has as many tokens as the other one and
    starts with a different token, which misses e.g. Qwen3's one-token ``" Lily"`` next to
    ``"L" "ily"``; here both encodings are always kept. An extra encoding only ever bans the
    same word written with its leading space.

    Raises:
        ValueError: a word that encodes to no token (empty or only spaces).
    """
    out: list[tuple[int, ...]] = []
    for word in words:
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(tokenizer.encode(text, add_special_tokens=False)) if word.strip() else ()
            if not ids:
                raise ValueError(f"bad_words: {word!r} encodes to no token")
            if ids not in out:
                out.append(ids)
    return tuple(out)


def direct_decoder(
    tokenizer: PreTrainedTokenizerBase, skip_special_tokens: bool, spaces_between_special_tokens: bool = True
) -> Callable[[list[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=..., spaces_between_special_tokens=...)``,
    as cheap as it can be exact.

    A fast (Rust-backed) tokenizer's ``decode`` is the Rust ``decode`` plus, when
    ``clean_up_tokenization_spaces`` is set, a clean-up pass; the Python wrapper around it
    (argument conversion, ``to_py_obj`` over every id) costs more than the decode of a few
    tokens. When the tokenizer is one whose ``decode`` / ``_decode`` are transformers' own and
    it does no clean-up, the Rust ``decode`` is called directly (the same text: the keyword
    ``spaces_between_special_tokens`` does nothing for fast tokenizers); any other tokenizer
    goes through ``tokenizer.decode``.
    """
    try:
        from transformers.tokenization_utils_tokenizers import TokenizersBackend
    except ImportError:  # pragma: no cover - another transformers layout: the general path
        TokenizersBackend = None  # noqa: N806
    cls = type(tokenizer)
    backend = getattr(tokenizer, "_tokenizer", None)
    if (
        TokenizersBackend is not None
        and isinstance(tokenizer, TokenizersBackend)
        and cls.decode is PreTrainedTokenizerBase.decode
        and cls._decode is TokenizersBackend._decode
        and not tokenizer.clean_up_tokenization_spaces
        and backend is not None
    ):
        decode = backend.decode
        return lambda ids: decode(ids, skip_special_tokens=skip_special_tokens)
    return lambda ids: tokenizer.decode(
        ids,
        skip_special_tokens=skip_special_tokens,
        spaces_between_special_tokens=spaces_between_special_tokens,
    )


@functools.lru_cache(maxsize=8)
def _skipped_special_ids(tokenizer: PreTrainedTokenizerBase) -> frozenset[int]:
    """Ids that ``decode(..., skip_special_tokens=True)`` drops whichever path decodes them:
    in ``all_special_ids`` (the Python path's set) and added as special (the Rust one's).
    Cached per tokenizer object (tokenizers hash by identity; Surge never adds tokens to a
    loaded one): building the set walks every added token, ~20 us for Qwen3's, once per
    request otherwise."""
    added = getattr(tokenizer, "added_tokens_decoder", {}) or {}
    special = {i for i, token in added.items() if getattr(token, "special", False)}
    return frozenset(special.intersection(tokenizer.all_special_ids))


class IncrementalDetokenizer:
    """Turn a request's output token ids into text deltas that are safe to stream.

    Algorithm (vLLM ``detokenize_incrementally`` / TGI): keep two offsets into the token
    list, ``prefix_offset`` <= ``read_offset``. Each step decodes the small window
    ``ids[prefix_offset:read_offset]`` (text already emitted, used as left context so
    SentencePiece leading spaces and merges come out right) and ``ids[prefix_offset:]``;
    the difference is the new text. If the new text ends in U+FFFD (a UTF-8 character split
    over byte-fallback tokens) nothing is emitted and the offsets stay until the character
    is complete. Cost per step is O(window), not O(output): skipped special tokens never enter
    the window (they would hold the offsets still while their run grows).

    Stop strings: the decoded text not yet emitted is searched for every stop string
    (matches across token boundaries); on a match the text is cut before it and
    ``stop_matched`` is set. The longest suffix that is a prefix of some stop string is held
    back, so no part of a stop string ever reaches a streamed delta; since that hold-back
    covers every possible partial match, a match can never start inside emitted text. Both come
    from one Aho-Corasick automaton (:mod:`surge.stop_strings`), so the cost per character does
    not grow with the number of stop strings.

    ``min_tokens`` follows vLLM v1 (``BaseIncrementalDetokenizer.update`` and
    ``check_stop_strings`` in ``vllm/v1/engine/detokenizer.py``): stop strings are looked for
    only once more than ``min_tokens`` output tokens exist (EOS and stop tokens count), and a
    match must end after the text of the first ``min_tokens`` tokens, but it may start inside it.
    With ``min_tokens=3`` and ``stop=["ab"]``: "ab" inside the 3rd token's text never matches; a
    3rd token ending in "a" and a 4th starting with "b" match, the text is cut before that "a"
    (after the "b" with ``include_stop_str_in_output``); so does "xab" when the 2nd token ends
    in "x" and the 3rd is "a". That early text goes through the automaton without matching, so
    its possible stop-string prefix is held back as usual and a cut never reaches emitted text.
    A character completed by a later token (UTF-8 split over tokens) is that token's text. An
    :meth:`update` with tokens inside the first ``min_tokens`` takes those one at a time (as
    vLLM decodes them), then the rest as one.

    Invariant: ``"".join(deltas) + flush() == text``.

    Args:
        tokenizer: the tokenizer.
        prompt_token_ids: the prompt (its last tokens give left context).
        skip_special_tokens: leave special tokens out of the text.
        stop: stop strings (non-empty).
        min_tokens: no stop string may end in the text of this many first output tokens.
        include_stop_str_in_output: keep a matched stop string, and the text of the EOS or stop
            token that ended the request, in the text (vLLM's flag).
        spaces_between_special_tokens: passed to ``tokenizer.decode``: slow (Python)
            tokenizers put a space around kept special tokens when True; fast tokenizers never
            add one, so for them both values give the same text (as in vLLM).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        prompt_token_ids: Sequence[int],
        *,
        skip_special_tokens: bool = True,
        stop: tuple[str, ...] = (),
        min_tokens: int = 0,
        include_stop_str_in_output: bool = False,
        spaces_between_special_tokens: bool = True,
    ) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._include_stop = include_stop_str_in_output
        self._decode = direct_decoder(tokenizer, skip_special_tokens, spaces_between_special_tokens)
        self._skipped = _skipped_special_ids(tokenizer) if skip_special_tokens else frozenset()
        self._stop = tuple(s for s in stop if s)
        self._automaton = StopAutomaton.build(self._stop) if self._stop else None
        self._state = 0  # automaton state: its depth is the length of ``_pending``
        self._min_tokens = min_tokens
        context = list(prompt_token_ids[-_INITIAL_PREFIX_TOKENS:])
        self._ids: list[int] = context
        self._prefix_offset = 0
        self._read_offset = len(context)
        self._held_at_check = 0  # held tokens at the last decode that released nothing
        self._emitted: list[str] = []
        self._pending = ""  # decoded, not emitted: a possible stop-string prefix
        self._finished = False
        self.stop_matched: str | None = None
        self.num_output_tokens = 0

    @classmethod
    def for_params(
        cls, tokenizer: PreTrainedTokenizerBase, prompt_token_ids: Sequence[int], params: SamplingParams
    ) -> IncrementalDetokenizer:
        """The detokenizer of one choice that samples with ``params`` (its special-token,
        stop-string and ``min_tokens`` settings), after ``prompt_token_ids``."""
        return cls(
            tokenizer,
            prompt_token_ids,
            skip_special_tokens=params.skip_special_tokens,
            stop=params.stop,
            min_tokens=params.min_tokens,
            include_stop_str_in_output=params.include_stop_str_in_output,
            spaces_between_special_tokens=params.spaces_between_special_tokens,
        )

    @property
    def text(self) -> str:
        """The output text so far (cut before a matched stop string), including held-back text
        that is complete; bytes of an unfinished character are not included until ``flush``."""
        return "".join(self._emitted) + self._pending

    @property
    def num_held_chars(self) -> int:
        """Characters decoded but held back as a possible stop-string prefix (not emitted yet)."""
        return len(self._pending)

    def _decode_new(self, final: bool) -> str:
        """New complete text since ``read_offset`` ('' while a character is incomplete).

        A held window longer than :data:`_HELD_TOKENS` (bytes that never form a character, e.g.
        lone UTF-8 continuation bytes) is decoded again only once it has grown by half since
        its last decode: decoding it at every token made CPU quadratic in its length (8,000 such
        tokens cost 4 s of the API process). Its text is released at the first of those decodes
        that ends on a whole character, or at the finish: possibly long after the token that
        completed it (nine lone bytes and an "a", repeated: the first text after 140 tokens, not
        10). A decoder's text for a run of byte tokens may depend on the whole run
        (SentencePiece's byte fallback writes every byte of an invalid run as U+FFFD), so no
        part of a held window is released before the window itself decodes whole. Within the
        first ``min_tokens`` tokens it is decoded at every token: text they complete, released
        later, would reach the stop strings as text where a match may end."""
        held = len(self._ids) - self._read_offset
        if held <= 0:
            return ""
        if (
            not final
            and held > _HELD_TOKENS
            and 2 * held < 3 * self._held_at_check
            and self.num_output_tokens > self._min_tokens  # text there may end no stop string
        ):
            return ""
        prefix_text = self._decode(self._ids[self._prefix_offset : self._read_offset])
        new_text = self._decode(self._ids[self._prefix_offset :])
        if not final and (len(new_text) <= len(prefix_text) or new_text.endswith(_REPLACEMENT_CHAR)):
            self._held_at_check = held
            return ""
        self._held_at_check = 0
        delta = new_text[len(prefix_text) :]
        self._prefix_offset = self._read_offset
        self._read_offset = len(self._ids)
        if self._prefix_offset > _TRIM_TOKENS:
            del self._ids[: self._prefix_offset]
            self._read_offset -= self._prefix_offset
            self._prefix_offset = 0
        return delta

    def _push(self, delta: str) -> str:
        """Run stop matching on newly decoded text and return the part safe to emit."""
        if self._finished or not delta:
            return ""
        automaton = self._automaton
        if automaton is None:
            self._emitted.append(delta)
            return delta
        buf = self._pending + delta
        if self.num_output_tokens <= self._min_tokens:
            # The first min_tokens tokens' text: no match ends here, but one may start here.
            self._state, match = automaton.advance(self._state, delta), None
        else:
            self._state, match = automaton.feed(self._state, delta)
        if match is not None:
            self._finished = True
            self.stop_matched = match.stop
            self._pending = ""
            match_at = len(buf) - len(delta) + match.start
            out = buf[: match_at + len(match.stop)] if self._include_stop else buf[:match_at]
        else:
            hold = automaton.held_back(self._state)
            out = buf[: len(buf) - hold]
            self._pending = buf[len(buf) - hold :]
        if out:
            self._emitted.append(out)
        return out

    def update(self, new_token_ids: Sequence[int], stop_token_id: int | None = None) -> str:
        """Add new output tokens; return the text delta that is safe to emit now.

        Args:
            new_token_ids: tokens generated since the previous call.
            stop_token_id: the EOS / stop token that ended the request, if any; when it is
                the last of ``new_token_ids`` it is left out of the text (unless
                ``include_stop_str_in_output``).

        Returns:
            The new text ('' when everything new is held back).
        """
        ids = list(new_token_ids)
        before = self.num_output_tokens
        if self._automaton is not None and before < self._min_tokens and len(ids) > 1:
            # Tokens inside the first min_tokens, where no match may end, go one at a time: a
            # chunk decoded whole holds back all its text when it ends inside a character, and
            # that text would then reach the matcher with the tokens after the boundary.
            cut = min(self._min_tokens - before, len(ids))
            out = "".join(self.update([t]) for t in ids[: cut - 1])
            if cut == len(ids):
                return out + self.update(ids[-1:], stop_token_id)
            return out + self.update(ids[cut - 1 : cut]) + self.update(ids[cut:], stop_token_id)
        self.num_output_tokens += len(ids)
        if stop_token_id is not None and ids and ids[-1] == stop_token_id and not self._include_stop:
            ids.pop()
        if self._skipped:
            # Skipped special tokens add no text and do not touch their neighbours' text, so
            # they stay out of the window: a run of them (EOS after a finished grammar with
            # ignore_eos) would otherwise hold the offsets still and grow every decode.
            ids = [t for t in ids if t not in self._skipped]
        if self._finished or not ids:
            return ""
        self._ids.extend(ids)
        return self._push(self._decode_new(final=False))

    def flush(self) -> str:
        """Return everything still held back; call once when the request finishes.

        An unfinished multi-byte character is decoded as is (U+FFFD), and text held back as
        a possible stop-string prefix is released.
        """
        if self._finished:
            return ""
        out = self._push(self._decode_new(final=True))
        rest = self._pending
        self._pending = ""
        self._finished = True
        if rest:
            self._emitted.append(rest)
        return out + rest
