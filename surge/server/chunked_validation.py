"""Long lists of request models validated and dumped a chunk at a time, yielding to the event loop.

pydantic validates a whole body in one call that holds the GIL, so moving it to a thread frees
nothing: a chat body of 90,000 short messages (3.9 MB, under the 4 MiB body limit) took about
0.9 s to validate and 0.6-1.0 s more to dump back to dicts for the chat template, and every other
client's stream stood still meanwhile (``benchmarks/body_stall.py``,
``benchmarks/results/body-stall-cpu-s62/``). Each message is a pydantic model, which is what
makes it costly (about 7 us each).

:func:`prevalidate` runs before FastAPI's validation of a body: it validates the body's long
lists of models (``messages``) :data:`CHUNK` elements at a time, with an ``await
asyncio.sleep(0)`` between chunks, and puts the validated instances in place of the dicts.
pydantic takes an instance of the field's model as it is (models are not revalidated), so
FastAPI's validation then costs an ``isinstance`` per element. A chunk that does not validate
stops the work: it and the elements after it stay dicts, so FastAPI's validation reports the
error exactly as before (same message, naming ``messages[N]``). :func:`dump_models`
turns the models back into dicts for the chat template the same way. Short lists (a normal
request) take the old path untouched.
"""

from __future__ import annotations

import asyncio
import functools
import types
import typing
from collections.abc import Sequence
from typing import Any

from pydantic import BaseModel, TypeAdapter, ValidationError

CHUNK = 1024
"""Elements validated (or dumped) between two yields to the event loop: about 7 ms of work."""


@functools.cache
def model_list_fields(model: type[BaseModel]) -> tuple[tuple[str, TypeAdapter[list[Any]]], ...]:
    """The fields of ``model`` declared ``list[M]`` (or ``list[M] | None``) with ``M`` a pydantic
    model, each with a validator of such a list."""
    out = []
    for name, info in model.model_fields.items():
        annotation = info.annotation
        if typing.get_origin(annotation) in (typing.Union, types.UnionType):
            members = [a for a in typing.get_args(annotation) if a is not type(None)]
            annotation = members[0] if len(members) == 1 else None
        if typing.get_origin(annotation) is not list:
            continue
        (item,) = typing.get_args(annotation)
        if isinstance(item, type) and issubclass(item, BaseModel):
            out.append((info.alias or name, TypeAdapter(list[item])))  # type: ignore[valid-type]
    return tuple(out)


async def prevalidate(data: Any, model: type[BaseModel]) -> None:
    """Validate, in place, the long lists of models of the JSON body ``data`` (a dict, as parsed)
    for ``model``: each list of more than :data:`CHUNK` elements is validated a chunk at a time,
    yielding to the event loop between chunks, and its elements replaced by the model instances.
    Stops at the first chunk that does not validate (those elements stay as they were, for the
    body's own validation to report). Anything else in ``data`` is left alone."""
    if not isinstance(data, dict):
        return
    for name, adapter in model_list_fields(model):
        items = data.get(name)
        if not isinstance(items, list) or len(items) <= CHUNK:
            continue
        done: list[Any] = []
        for start in range(0, len(items), CHUNK):
            await asyncio.sleep(0)
            try:
                done.extend(adapter.validate_python(items[start : start + CHUNK]))
            except ValidationError:
                break  # left to the body's validation, which names the element
        data[name] = done + items[len(done) :]


async def dump_models(models: Sequence[BaseModel], **kwargs: Any) -> list[dict[str, Any]]:
    """``[m.model_dump(**kwargs) for m in models]``, yielding to the event loop every
    :data:`CHUNK` models when there are more than that."""
    if len(models) <= CHUNK:
        return [m.model_dump(**kwargs) for m in models]
    out: list[dict[str, Any]] = []
    for start in range(0, len(models), CHUNK):
        await asyncio.sleep(0)
        out.extend(m.model_dump(**kwargs) for m in models[start : start + CHUNK])
    return out
