"""uvicorn's internals that :mod:`surge.server.http_protocol` subclasses and re-implements.

The guarded protocols override uvicorn's HTTP protocols (httptools' and h11's) and lean on what
uvicorn keeps private: ``_feed`` is ``HttpToolsProtocol.data_received`` with upgrades ignored,
the pipelining cap reads the order of ``self.pipeline``, the body drain re-arms
``timeout_keep_alive_task`` and waits for ``on_response_complete``, the h2c upgrade sets a
cycle's ``more_body``. A uvicorn that changed one of them need not fail loudly: a guard could
stop guarding, or a fix uvicorn made to ``data_received`` be skipped. So pyproject.toml
bounds uvicorn to the versions checked against this module, and this test fails when a method it
leans on is not one of those versions' (whose test suite ``tests/server/test_http_protocol.py``
passed too), so that raising the bound means reading what changed first.
"""

from __future__ import annotations

import hashlib
import inspect
import tomllib
from pathlib import Path

import uvicorn
from packaging.requirements import Requirement
from uvicorn.protocols.http import h11_impl, httptools_impl

REVIEWED_VERSIONS = ("0.29.0", "0.38.0", "0.55.0")
"""uvicorn versions whose methods below were read against surge/server/http_protocol.py and under
which tests/server/test_http_protocol.py passes: the lower bound, the version
scripts/build_wheelhouse.sh bundles for GPU hosts, the newest."""

REVIEWED = {
    "httptools_impl.HttpToolsProtocol.__init__": {"465b2684b6b1505c", "4f08999410347141", "ad2dadb8a62157e7"},
    "httptools_impl.HttpToolsProtocol.connection_lost": {"09b3796aea6cf1c3", "c91a4c9bf2e29c55"},
    "httptools_impl.HttpToolsProtocol._unset_keepalive_if_required": {"00a6a4e47214e68e"},
    "httptools_impl.HttpToolsProtocol._should_upgrade": {"754bcb8a2c984c5f", "8fcad1ab8e096739"},
    "httptools_impl.HttpToolsProtocol.data_received": {"010a7ae59a5d3b1a", "5110e89d88fa6872"},
    "httptools_impl.HttpToolsProtocol.handle_websocket_upgrade": {"179c4f769386ab89", "d5da377bfc77e588"},
    "httptools_impl.HttpToolsProtocol.on_message_begin": {
        "447a44b04913c696",
        "4c84b9006708542d",
        "96d377fdc7c2baef",
    },
    "httptools_impl.HttpToolsProtocol.on_url": {"37be44e962b04ca8"},
    "httptools_impl.HttpToolsProtocol.on_header": {"1e86ebb6cea0458c", "65d62c044f61fdbd"},
    "httptools_impl.HttpToolsProtocol.on_headers_complete": {"0b1877df5f7e0682", "1ea8589acfad92d8"},
    "httptools_impl.HttpToolsProtocol.on_body": {"dba9c32aeba35b6a"},
    "httptools_impl.HttpToolsProtocol.on_message_complete": {"1fbad42dc31fc01f"},
    "httptools_impl.HttpToolsProtocol.on_response_complete": {"64e254f28e389e76", "95a145436f8b3332"},
    "httptools_impl.HttpToolsProtocol.timeout_keep_alive_handler": {"8b53bf5f2e202970"},
    "httptools_impl.RequestResponseCycle.__init__": {"4d2f220910c33c12", "5d957eb45b201f03"},
    "httptools_impl.RequestResponseCycle.send": {"abdd8601b326a8da", "c1edbd7f2d25568d", "ce7421dd9e6e35a8"},
    "httptools_impl.RequestResponseCycle.receive": {"206ba14150e86c61", "8124ae006be71184"},
    "h11_impl.H11Protocol.connection_lost": {"dbb688fa2b386000"},
    "h11_impl.H11Protocol.data_received": {"e03b145518ca44aa"},
    "h11_impl.H11Protocol.handle_events": {"1f110fda92c62b82", "278f2d7efca279a3", "cf1c855d7f23d761"},
    "h11_impl.H11Protocol.on_response_complete": {"1fbb8f48c6a1afc4"},
    "h11_impl.H11Protocol.timeout_keep_alive_handler": {"fcd7338529fe645e"},
    "h11_impl.RequestResponseCycle.send": {"0b7daeae3fa2aca2", "76b4bcb0998bed0e", "b5ee39c71ca38569"},
}
"""``module.Class.method`` -> the first 16 hex digits of the SHA-256 of its source in the reviewed
versions (one digest per distinct source)."""


def _digest(qualified: str) -> str:
    module, cls, method = qualified.split(".")
    owner = getattr({"httptools_impl": httptools_impl, "h11_impl": h11_impl}[module], cls)
    return hashlib.sha256(inspect.getsource(getattr(owner, method)).encode()).hexdigest()[:16]


def test_the_uvicorn_methods_the_guards_rely_on_are_the_reviewed_ones() -> None:
    changed = [name for name, digests in REVIEWED.items() if _digest(name) not in digests]
    assert not changed, (
        f"uvicorn {uvicorn.__version__} changed {', '.join(changed)}, on which "
        "surge/server/http_protocol.py relies (reviewed: uvicorn " + ", ".join(REVIEWED_VERSIONS) + "): "
        "read the change against it, then add this version's digests here and raise pyproject.toml's bound"
    )


def test_pyproject_admits_no_uvicorn_newer_than_the_reviewed_ones() -> None:
    """pip must not install a uvicorn whose internals nobody checked (the newest reviewed version's
    next patch release is outside the bound), nor refuse the reviewed ones."""
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    [spec] = [
        req.specifier
        for req in map(Requirement, pyproject["project"]["dependencies"])
        if req.name == "uvicorn"
    ]
    for version in REVIEWED_VERSIONS:
        assert spec.contains(version), (spec, version)
    major, minor, patch = max(REVIEWED_VERSIONS, key=lambda v: tuple(map(int, v.split(".")))).split(".")
    assert not spec.contains(f"{major}.{minor}.{int(patch) + 1}"), spec  # a fresh install gets a reviewed one
