"""The structured-output fields of a request (``response_format``, ``structured_outputs``,
the old ``guided_*`` names) turned into the engine's :class:`StructuredOutputsParams`.

Every grammar is checked here, in the API process (xgrammar without a tokenizer, a few
milliseconds): a bad schema, regex or grammar is a 400 naming the field and never reaches the
engine.
"""

from __future__ import annotations

import json
from typing import Any

import msgspec

from surge.sampling_params import StructuredOutputsParams
from surge.server.errors import bad_request
from surge.structured.validate import check_structured_outputs

_STRUCTURED_KEYS = ("json", "regex", "choice", "grammar", "json_object", "structural_tag")
# vLLM's options next to the constraint: the JSON spacing, and its guidance backend's switch that
# closes object schemas, which Surge's grammar (xgrammar's strict mode, as vLLM's default
# xgrammar backend) always does; both booleans
_STRUCTURED_OPTIONS = ("disable_any_whitespace", "disable_additional_properties")


def _json_text(value: Any, param: str) -> str:
    """A JSON schema given as an object or as JSON text, as JSON text (400 otherwise)."""
    if isinstance(value, dict):
        return json.dumps(value)
    if isinstance(value, str):
        try:
            parsed = json.loads(value)
        except RecursionError:
            raise bad_request(f"{param} is nested too deeply to parse as JSON", param=param) from None
        except ValueError as e:
            raise bad_request(f"{param} is not valid JSON: {e}", param=param) from e
        if not isinstance(parsed, dict | bool):
            raise bad_request(f"{param} must be a JSON schema object", param=param)
        return value
    if isinstance(value, bool):
        return json.dumps(value)
    raise bad_request(f"{param} must be a JSON schema object", param=param)


# ``schema`` with ``json_object``: the shape of llama.cpp, Together and Fireworks (a schema-bound JSON object)
_RESPONSE_FORMAT_KEYS = {
    "text": ("type",),
    "json_object": ("type", "schema"),
    "json_schema": ("type", "json_schema"),
    # vLLM's two forms: xgrammar's ``format``, or the older ``structures`` with ``triggers``
    "structural_tag": ("type", "format", "structures", "triggers"),
}
# OpenAI's json_schema object (``json_schema``: the nested spelling some clients send for ``schema``)
_JSON_SCHEMA_KEYS = ("name", "description", "schema", "strict", "json_schema")


def _no_unknown_keys(obj: dict[str, Any], allowed: tuple[str, ...], where: str) -> None:
    """400 naming ``where.<key>`` for a key OpenAI does not define there (it would be ignored);
    a key set to ``null`` counts as absent (clients dump unset fields so)."""
    unknown = sorted(k for k, v in obj.items() if k not in allowed and v is not None)
    if unknown:
        raise bad_request(
            f"{where}.{unknown[0]} is not a field of {where} (fields: {', '.join(allowed)})",
            param=f"{where}.{unknown[0]}",
        )


def _from_response_format(rf: Any) -> StructuredOutputsParams | None:
    if not isinstance(rf, dict):
        raise bad_request("response_format must be an object with a 'type'", param="response_format")
    kind = rf.get("type")
    if isinstance(kind, str) and kind in _RESPONSE_FORMAT_KEYS:
        _no_unknown_keys(rf, _RESPONSE_FORMAT_KEYS[kind], "response_format")
    if kind == "text":
        return None
    if kind == "json_object":
        if rf.get("schema") is not None:
            return StructuredOutputsParams(json=_json_text(rf["schema"], "response_format.schema"))
        return StructuredOutputsParams(json_object=True)
    if kind == "json_schema":
        spec = rf.get("json_schema")
        if not isinstance(spec, dict):
            raise bad_request(
                "response_format of type json_schema needs a 'json_schema' object "
                '({"name": ..., "schema": {...}, "strict": ...})',
                param="response_format.json_schema",
            )
        _no_unknown_keys(spec, _JSON_SCHEMA_KEYS, "response_format.json_schema")
        strict = spec.get("strict")
        if strict is not None and not isinstance(strict, bool):  # the grammar is always strict
            raise bad_request(
                "response_format.json_schema.strict must be true or false",
                param="response_format.json_schema.strict",
            )
        description = spec.get("description")
        if description is not None and not isinstance(description, str):
            raise bad_request(
                "response_format.json_schema.description must be a string",
                param="response_format.json_schema.description",
            )
        if spec.get("schema") is not None and spec.get("json_schema") is not None:
            raise bad_request(
                "response_format.json_schema has both 'schema' and 'json_schema' (vLLM's alias of it); send one",
                param="response_format.json_schema.json_schema",
            )
        schema = spec.get("schema", spec.get("json_schema"))
        if schema is None:
            raise bad_request(
                "response_format.json_schema needs a 'schema'", param="response_format.json_schema.schema"
            )
        name = spec.get("name")
        if not isinstance(name, str) or not name:  # required by OpenAI and vLLM
            raise bad_request(
                "response_format.json_schema.name must be a non-empty string (the schema's name)",
                param="response_format.json_schema.name",
            )
        return StructuredOutputsParams(json=_json_text(schema, "response_format.json_schema.schema"))
    if kind == "structural_tag":
        tag = {k: v for k, v in rf.items() if v is not None}  # a null key is unset, as elsewhere
        has_format, has_structures = "format" in tag, "structures" in tag
        if has_format == has_structures:
            raise bad_request(
                "response_format of type structural_tag needs either 'format' (an xgrammar structural "
                "tag format) or 'structures' with 'triggers'",
                param="response_format",
            )
        if has_format and "triggers" in tag:  # xgrammar's format form has no triggers: never read
            raise bad_request(
                "response_format.triggers belongs to the older structural tag form (with 'structures'); "
                "the 'format' form puts its triggers inside the format (e.g. triggered_tags)",
                param="response_format.triggers",
            )
        return StructuredOutputsParams(structural_tag=json.dumps(tag))
    raise bad_request(
        "response_format type must be 'text', 'json_object', 'json_schema' or 'structural_tag', "
        f"got {kind!r}",
        param="response_format.type",
    )


def _from_structured_outputs(so: Any) -> StructuredOutputsParams:
    param = "structured_outputs"
    if not isinstance(so, dict):
        raise bad_request("structured_outputs must be an object", param=param)
    for option in _STRUCTURED_OPTIONS:
        value = so.get(option)
        if value is not None and not isinstance(value, bool):
            raise bad_request(
                f"structured_outputs.{option} must be a boolean, got {type(value).__name__}",
                param=f"{param}.{option}",
            )
    spacing = so.get("disable_any_whitespace")
    known = (*_STRUCTURED_KEYS, *_STRUCTURED_OPTIONS)
    unknown = sorted(k for k, v in so.items() if k not in known and v not in (None, False))
    if unknown:
        raise bad_request(
            f"structured_outputs.{unknown[0]} is not supported by Surge (use one of {', '.join(_STRUCTURED_KEYS)})",
            param=f"{param}.{unknown[0]}",
        )
    set_keys = [k for k in _STRUCTURED_KEYS if so.get(k) not in (None, False)]
    if len(set_keys) != 1:
        raise bad_request(
            f"structured_outputs must set exactly one of {', '.join(_STRUCTURED_KEYS)}", param=param
        )
    key = set_keys[0]
    params = _single(key, so[key], f"{param}.{key}")
    if spacing is None:
        return params
    # vLLM's spacing switch: False allows any whitespace between JSON tokens (vLLM's default)
    return msgspec.structs.replace(params, disable_any_whitespace=spacing)


def _single(kind: str, value: Any, param: str) -> StructuredOutputsParams:
    if kind == "json":
        return StructuredOutputsParams(json=_json_text(value, param))
    if kind == "json_object":
        if value is not True:
            raise bad_request(f"{param} must be true", param=param)
        return StructuredOutputsParams(json_object=True)
    if kind == "structural_tag":  # JSON text in vLLM; an object is taken too
        if isinstance(value, dict):
            return StructuredOutputsParams(structural_tag=json.dumps(value))
        if not isinstance(value, str) or not value:
            raise bad_request(f"{param} must be a structural tag (JSON text or an object)", param=param)
        return StructuredOutputsParams(structural_tag=value)
    if kind == "choice":
        if not isinstance(value, list) or not value or not all(isinstance(c, str) for c in value):
            raise bad_request(f"{param} must be a non-empty list of strings", param=param)
        return StructuredOutputsParams(choice=tuple(value))
    if not isinstance(value, str) or not value:
        raise bad_request(f"{param} must be a non-empty string", param=param)
    return StructuredOutputsParams(regex=value) if kind == "regex" else StructuredOutputsParams(grammar=value)


def structured_outputs_of(body: Any) -> tuple[StructuredOutputsParams | None, str | None]:
    """The grammar a request asks for, and the name of the field that asked.

    Sources: ``response_format`` (``json_object``, ``json_schema`` or vLLM's ``structural_tag``),
    ``structured_outputs`` (vLLM: one of ``json``, ``regex``, ``choice``, ``grammar``,
    ``json_object``, ``structural_tag``), and
    ``guided_json`` / ``guided_regex`` / ``guided_choice`` / ``guided_grammar``. At most one
    may be given. The grammar is validated.

    Raises:
        ApiError: 400 naming the field: malformed, invalid schema/regex/grammar, or several.
    """
    found: list[tuple[str, StructuredOutputsParams]] = []
    rf = getattr(body, "response_format", None)
    if rf is not None:
        params = _from_response_format(rf)
        if params is not None:
            schema_shape = isinstance(rf, dict) and rf.get("type") == "json_object" and params.kind == "json"
            found.append(("response_format.schema" if schema_shape else "response_format", params))
    so = getattr(body, "structured_outputs", None)
    if so is not None:
        found.append(("structured_outputs", _from_structured_outputs(so)))
    for kind in ("json", "regex", "choice", "grammar"):
        value = getattr(body, f"guided_{kind}", None)
        if value is not None:
            found.append((f"guided_{kind}", _single(kind, value, f"guided_{kind}")))
    if not found:
        return None, None
    if len(found) > 1:
        names = " and ".join(name for name, _ in found)
        raise bad_request(f"only one structured output may be asked for, got {names}", param=found[1][0])
    field, params = found[0]
    validate(params, field)
    return params, field


def grammar_param(params: StructuredOutputsParams, field: str) -> str:
    """The request field an error about the grammar ``params`` names: ``field`` (as
    :func:`structured_outputs_of` returns it, or ``tools``) with the kind where the field holds
    several (``structured_outputs.regex``, ``response_format.json_schema.schema``)."""
    if field == "structured_outputs":
        return f"structured_outputs.{params.kind}"
    if field == "response_format" and params.kind == "json":
        return "response_format.json_schema.schema"
    return field


def validate(params: StructuredOutputsParams, field: str) -> None:
    """Raise a 400 naming ``field`` (with the kind, e.g. ``structured_outputs.regex``) when
    the grammar is invalid."""
    try:
        check_structured_outputs(params)
    except ValueError as e:
        param = grammar_param(params, field)
        raise bad_request(f"{param}: {e}", param=param) from e
