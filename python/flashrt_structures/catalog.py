"""The structure catalog: the versioned seam specifications, schemes, ladders, gates and
bindings shipped with the package (catalog/ in the repository).

The files are parsed and validated by the core (``_core.load_catalog``); this module only finds
the installed folder, checks that every kernel package the catalog names is on the kernel path,
and keeps one loaded catalog per process, since the files do not change while a host runs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from . import _core

if TYPE_CHECKING:
    from ._core import Catalog, StructureSpec

# The install copies the repository's catalog/ here.
CATALOG_DIR = Path(__file__).resolve().parent / "catalog"


def load_catalog(directory: str | Path) -> Catalog:
    """Loads and validates a catalog folder; ValueError naming the file and key on any problem,
    including a ladder or scheme naming a kernel package that is not on the kernel path."""
    cat = _core.load_catalog(str(directory))
    missing = cat.missing_packages(_core.visible_packages())
    if missing:
        raise ValueError("flashrt catalog: " + "; ".join(missing))
    return cat


@functools.cache
def shipped() -> Catalog:
    """The catalog installed with the package."""
    return load_catalog(CATALOG_DIR)


def list_structures() -> list[str]:
    """Names of the shipped structures, sorted."""
    return list(shipped().names())


def load(name: str) -> StructureSpec:
    """The spec called ``name``; KeyError, listing the known names, when there is none."""
    cat = shipped()
    known = cat.names()
    if name not in known:
        raise KeyError(f"unknown structure {name!r} (known: {', '.join(known)})")
    return cat.get(name)


__all__ = ["CATALOG_DIR", "list_structures", "load", "load_catalog", "shipped"]
