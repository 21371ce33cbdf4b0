"""Stand-ins for two packages SGLang imports at module level on its CPU path and never calls on
the torch-native path: `sgl_kernel` (PyPI has CUDA builds only) and `torchvision` (PyPI's build is
a CUDA one that breaks CPU torch's imports). Test environment only (.venv-sglang, put on the path
by scripts/setup_sglang.sh). Any name read from them is a callable that raises, and every call is
appended to the file named by FLASHRT_STANDIN_CALLS, so a test fails if one is ever called, in
whichever of SGLang's processes it happened."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
from typing import Any


class StandinCalled(RuntimeError):
    """A stand-in function was called: SGLang left its torch-native path."""


def _record(name: str) -> None:
    path = os.environ.get("FLASHRT_STANDIN_CALLS")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(f"{os.getpid()} {name}\n")


class _Name:
    """A name read from a stand-in module: a class to subclass or annotate with, never to call."""

    def __init__(self, qualname: str) -> None:
        self._qualname = qualname

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Name(f"{self._qualname}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        _record(self._qualname)
        raise StandinCalled(f"{self._qualname} is a test stand-in (python/tests_sglang/standins): "
                            "SGLang called it, so it left its torch-native path")

    def __mro_entries__(self, bases: tuple) -> tuple:
        return (object,)


class _Module(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Name(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, roots: tuple[str, ...]) -> None:
        self.roots = roots

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname.split(".")[0] in self.roots:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _Module(spec.name)
        module.__path__ = []  # a package: its submodules come from this finder too
        module.__flashrt_standin__ = True
        # transformers asks for a version of what it finds: one below every minimum it checks.
        module.__version__ = "0.0.0"
        module.__file__ = __file__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def install(roots: tuple[str, ...] = ("sgl_kernel", "torchvision")) -> None:
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.append(_Finder(roots))
