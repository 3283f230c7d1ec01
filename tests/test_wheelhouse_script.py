"""scripts/build_wheelhouse.sh bundles every dependency of Surge that it does not leave to the host.

The bundle is installed on an air-gapped GPU host with ``pip install --no-index --find-links DEST
surge``: a dependency that is neither in the bundle (``pkgs``) nor among those the host is assumed
to have (``host_has``) makes that install fail. uvloop was such a dependency until session 41.
The arrays are read from the script by bash itself, so no pip runs and nothing is downloaded.
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build_wheelhouse.sh"


def _script_array(name: str) -> list[str]:
    """The elements of the bash array ``name`` as the script defines it (its literal definition
    evaluated by bash, nothing else of the script run)."""
    text = SCRIPT.read_text(encoding="utf-8")
    match = re.search(rf"^{name}=\(.*?^\)$", text, re.S | re.M)
    assert match, f"{SCRIPT.name} defines no array {name}"
    out = subprocess.run(
        ["bash", "-c", f'{match.group(0)}\nprintf "%s\\n" "${{{name}[@]}}"'],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def _names(specs: list[str]) -> set[str]:
    return {canonicalize_name(Requirement(s).name) for s in specs}


def _linux_dependencies() -> set[str]:
    """Canonical names of the project's dependencies on x86-64 Linux (markers evaluated there)."""
    deps = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["dependencies"]
    env = {"sys_platform": "linux", "platform_system": "Linux", "platform_machine": "x86_64"}
    names = set()
    for spec in deps:
        req = Requirement(spec)
        if req.marker is None or req.marker.evaluate(env):
            names.add(canonicalize_name(req.name))
    return names


def test_every_dependency_is_bundled_or_left_to_the_host() -> None:
    bundled = _names(_script_array("pkgs"))
    host = _names(_script_array("host_has"))
    missing = _linux_dependencies() - bundled - host
    assert not missing, f"neither bundled nor assumed on the host: {sorted(missing)}"


def test_bundle_is_pinned_and_disjoint_from_the_host() -> None:
    pkgs = _script_array("pkgs")
    assert pkgs and all(re.fullmatch(r"[A-Za-z0-9._-]+==[A-Za-z0-9.]+", p) for p in pkgs), pkgs
    assert not _names(pkgs) & _names(_script_array("host_has"))
