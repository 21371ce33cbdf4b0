"""The structure catalog: the versioned seam specifications shipped with the package.

The specs are parsed and validated by the core (``_core.load_catalog``); this module only finds
the installed folder and keeps one loaded catalog per process, since the files do not change
while a host runs.
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


@functools.cache
def _catalog() -> Catalog:
    return _core.load_catalog(str(CATALOG_DIR))


def list_structures() -> list[str]:
    """Names of the shipped structures, sorted."""
    return list(_catalog().names())


def load(name: str) -> StructureSpec:
    """The spec called ``name``; KeyError, listing the known names, when there is none."""
    catalog = _catalog()
    known = catalog.names()
    if name not in known:
        raise KeyError(f"unknown structure {name!r} (known: {', '.join(known)})")
    return catalog.get(name)


__all__ = ["CATALOG_DIR", "list_structures", "load"]
