"""How a chat message's ``content`` reaches the chat template: vLLM's
``--chat-template-content-format`` (``auto``, ``string``, ``openai``).

A chat template reads a message's content either as one string (``{{ message['content'] }}``:
Qwen3's, Qwen2's and Llama 3's templates) or as OpenAI's list of parts
(``{% for part in message['content'] %}{{ part['text'] }}{% endfor %}``: the templates of
multimodal models, and some users' own). ``string`` passes the text parts joined by newlines,
``openai`` the list of ``{"type": "text", "text": ...}`` parts; ``auto`` picks one per template
by reading its syntax tree, with vLLM's rules (``_detect_content_format`` in vLLM 0.26's
``vllm/renderers/hf.py``):

1. the variables that stand for the message list: ``messages``, and any name a
   ``{% set x = ... %}`` gives from one of them (as is, sliced, filtered or tested:
   ``messages[1:]``, ``messages | selectattr(...)``), followed through further ``set``\\ s;
2. the message variables: the targets of ``{% for m in <a message list> %}`` loops;
3. the template is ``openai`` when a ``{% for ... in X %}`` loops over a message variable's
   content (``m['content']`` or ``m.content``, also sliced, filtered or tested) or over a
   variable named ``content``; otherwise (and when the template does not parse) ``string``.

The detection runs once per template text (:func:`detect_content_format` is cached).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from typing import Literal

from jinja2 import nodes

logger = logging.getLogger(__name__)

ContentFormat = Literal["string", "openai"]
"""What a template receives: each message's content as one string, or as a list of parts."""

CONTENT_FORMAT_OPTIONS = ("auto", "string", "openai")
"""The values of ``--chat-template-content-format`` and ``LLM.chat(chat_template_content_format=)``."""


def check_content_format(option: object, name: str = "chat_template_content_format") -> None:
    """Refuse a content format other than :data:`CONTENT_FORMAT_OPTIONS`.

    Raises:
        ValueError: one line naming ``name`` and the values taken.
    """
    if option not in CONTENT_FORMAT_OPTIONS:
        raise ValueError(f"{name} must be 'auto', 'string' or 'openai', got {option!r}")


def resolve_content_format(option: str, template: str | None) -> ContentFormat:
    """The format ``template`` is rendered with: ``option`` itself unless it is ``auto``, then
    the template's own (:func:`detect_content_format`); a model without a template (None or
    ``""``: Surge's fallback rendering, which writes strings) gets ``string``.

    Raises:
        ValueError: ``option`` is not one of :data:`CONTENT_FORMAT_OPTIONS`.
    """
    check_content_format(option)
    if option != "auto":
        return "openai" if option == "openai" else "string"
    return detect_content_format(template) if template else "string"


def describe_content_format(option: str, template: str | None, source: str) -> tuple[int, str] | None:
    """The start-up log line of a server's (or ``LLM``'s) content format, as vLLM logs it once:
    ``(logging level, message)``: under ``auto`` the format detected in ``template`` (INFO); under
    a format given that differs from the detected one a WARNING (the given one is used); None
    when there is no template (the fallback rendering) or the format given is the detected one.

    Args:
        option: ``auto``, ``string`` or ``openai``.
        template: the template requests are rendered with (None or ``""``: none).
        source: what ``template`` is, for the message (e.g. "the model's chat template").

    Raises:
        ValueError: an unknown ``option``.
    """
    check_content_format(option)
    if not template:
        return None
    detected = detect_content_format(template)
    if option == "auto":
        how = "a list of text parts" if detected == "openai" else "one string"
        return logging.INFO, (
            f"chat template content format: {detected!r}, detected in {source} (a message's content "
            f"reaches it as {how}; --chat-template-content-format sets another)"
        )
    if option != detected:
        return logging.WARNING, (
            f"chat template content format: {option!r} as given, but {source} reads "
            f"{'a list of text parts' if detected == 'openai' else 'content as one string'} "
            f"({detected!r} detected): its prompts may lose the messages' text"
        )
    return None


@functools.lru_cache(maxsize=32)
def detect_content_format(template: str) -> ContentFormat:
    """``openai`` when ``template`` loops over a message's content as a list of parts, else
    ``string`` (the rules are the module docstring's); cached per template text (32 texts).

    A template that does not parse is ``string`` (its rendering reports the error).
    """
    tree = _parse(template)
    if tree is None:
        return "string"
    message_lists = _aliases(tree, "messages")
    message_vars = {
        loop.target.name
        for loop in tree.find_all(nodes.For)
        if isinstance(loop.target, nodes.Name) and _read_name(loop.iter) in message_lists
    }
    for loop in tree.find_all(nodes.For):
        if _read_name(loop.iter, key="content") in message_vars:
            return "openai"
        if isinstance(loop.iter, nodes.Name) and loop.iter.name == "content":
            return "openai"
    return "string"


def _parse(template: str) -> nodes.Template | None:
    """The syntax tree of ``template`` in the environment transformers renders chat templates
    with (its ``{% generation %}`` tag and loop controls), or None when it does not parse."""
    try:
        from transformers.utils.chat_template_utils import _compile_jinja_template

        environment = _compile_jinja_template(template).environment
        return environment.parse(template)
    except Exception as e:  # noqa: BLE001 - jinja2's TemplateSyntaxError and its relatives
        logger.warning("chat template content format: the template does not parse (%s); using 'string'", e)
        return None


def _read_name(node: nodes.Node, key: str | None = None) -> str | None:
    """The variable that ``node`` reads, as is or through slices, filters and tests
    (``x``, ``x[1:]``, ``x | reverse``, ``x is defined``), or with ``key`` its item or attribute
    ``key`` (``x['content']``, ``x.content``, also sliced, filtered or tested); None for any
    other expression."""
    while _wraps(node):
        node = node.node  # type: ignore[attr-defined]
    if key is not None:
        if not _item(node, key):
            return None
        node = node.node  # type: ignore[attr-defined]
    if isinstance(node, nodes.Name) and node.ctx == "load":
        return node.name
    return None


def _wraps(node: nodes.Node) -> bool:
    """Whether ``node`` reads the variable of its ``node`` whole: a filter, a test or a slice."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node is not None
    return isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice)


def _item(node: nodes.Node, key: str) -> bool:
    """Whether ``node`` is ``x['key']`` or ``x.key``."""
    if isinstance(node, nodes.Getitem):
        return isinstance(node.arg, nodes.Const) and node.arg.value == key
    return isinstance(node, nodes.Getattr) and node.attr == key


def _aliases(tree: nodes.Template, name: str) -> set[str]:
    """``name`` and every variable a ``{% set %}`` gives from it (:func:`_read_name`),
    transitively, wherever the ``set`` stands."""
    found = {name}
    changed = True
    while changed:
        changed = False
        for target, value in _assignments(tree):
            if target not in found and _read_name(value) in found:
                found.add(target)
                changed = True
    return found


def _assignments(tree: nodes.Template) -> Iterator[tuple[str, nodes.Expr]]:
    """``(name, value)`` of each ``{% set name = value %}`` of ``tree`` (one name only)."""
    for assign in tree.find_all(nodes.Assign):
        if isinstance(assign.target, nodes.Name):
            yield assign.target.name, assign.node
