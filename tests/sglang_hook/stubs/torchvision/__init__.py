"""IMPORT-ONLY STUB of torchvision, for the CPU tests of the SGLang hook. Not torchvision.

SGLang imports torchvision on its config path (image preprocessing for vision models), and no CPU
build of torchvision is installable here: `pip install torchvision` replaces the CPU torch with a
multi-GB CUDA build. The hook never touches images, so this stub only has to import. Every
attribute is a callable that raises, and any `torchvision.*` submodule resolves to such a stub.
It is put on `sys.path` by tests/sglang_hook/conftest.py only when no real torchvision exists.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

__version__ = "0.0.0+semgov.import-only-stub"
IS_SEMGOV_STUB = True


class _Unavailable:
    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is an import-only stub in semgov's CPU tests")

    def __getattr__(self, attr: str) -> _Unavailable:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self._name}.{attr}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Unavailable(f"{self.__name__}.{attr}")


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


sys.meta_path.insert(0, _Finder())


def __getattr__(attr: str) -> Any:
    if attr.startswith("__"):
        raise AttributeError(attr)
    return _Unavailable(f"torchvision.{attr}")
