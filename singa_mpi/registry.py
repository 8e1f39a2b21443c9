"""One registry type for everything a job names by a string: layer types, algorithms, updaters,
learning-rate schedules, init methods and store backends.

An entry is registered by a decorator next to its definition (``@LAYERS.register("kReLU")``),
directly (``BACKENDS.register("hdf5", obj=...)``), or as a lazy ``"package.module:Attr"``
string imported on its first lookup, so that a registry can list and find built-ins without
importing their modules up front (which would cost time or make an import cycle).  When that
module is imported, its decorator fulfils the lazy entry with the same object.

Names are free strings: the built-ins use SINGA's enum names, a plugin may use its own.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Callable, Generic, Iterator, TypeVar, overload

from singa_mpi.errors import ConfigError

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class _Lazy:
    """A ``"package.module:Attr"`` not imported yet (a class, so a registry of strings stays possible)."""

    target: str


def _origin(entry: object) -> str:
    """``module:qualname`` of a registered object (what a lazy target names), else its repr."""
    if isinstance(entry, _Lazy):
        return entry.target
    module, name = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}:{name}" if module and name else repr(entry)


class Registry(Generic[T]):
    """Names to objects of one kind; unknown names are one-line ConfigErrors listing the valid ones.

    kind:  what an entry is, for programming errors ("layer type", "updater").
    field: what a lookup error calls the name, e.g. the config field it came from
           ("updater.type" gives ``updater.type = kFoo: expected one of kAdaGrad, ...``);
           ``kind`` when not given.
    """

    def __init__(self, kind: str, field: str | None = None) -> None:
        self.kind = kind
        self.field = field or kind
        self._entries: dict[str, T | _Lazy] = {}

    @overload
    def register(self, *names: str) -> Callable[[T], T]: ...

    @overload
    def register(self, *names: str, obj: T) -> T: ...

    def register(self, *names: str, obj: T | None = None):
        """Register ``obj`` under every one of ``names`` (aliases); without ``obj``, a decorator that does."""
        if not names:
            raise ValueError(f"{self.kind} registry: register() needs at least one name")

        def add(entry: T) -> T:
            for name in names:  # check all before adding any: a refused call changes nothing
                self._check_free(name, entry)
            for name in names:
                self._put(name, entry)
            return entry

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"package.module:Attr"``; the module is imported on the first ``get(name)``."""
        module, colon, attr = target.partition(":")
        if not (module and colon and attr):
            raise ValueError(f"{self.kind} {name}: lazy target {target!r}: expected 'package.module:Attr'")
        self._check_free(name, _Lazy(target))
        self._put(name, _Lazy(target))

    def get(self, name: str) -> T:
        """The object registered as ``name`` (imported now if lazy); ConfigError listing the names otherwise."""
        try:
            entry = self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name is no name either
            valid = ", ".join(self.names()) or "(none registered)"
            raise ConfigError(f"{self.field} = {name}: expected one of {valid}") from None
        return self._resolve(name, entry) if isinstance(entry, _Lazy) else entry

    def names(self) -> list[str]:
        """Every registered name, lazy ones included (nothing is imported), sorted."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} names)"

    # ------------------------------------------------------------ internals
    def _check_free(self, name: str, entry: T | _Lazy) -> None:
        """ValueError unless ``name`` is free or ``entry`` fulfils (or repeats as a string) its lazy promise."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: name {name!r}: expected a non-empty string")
        old = self._entries.get(name)
        if old is None:
            return
        one_lazy = isinstance(old, _Lazy) != isinstance(entry, _Lazy)
        if not (one_lazy and _origin(old) == _origin(entry)):
            raise ValueError(f"{self.kind} {name} registered twice: {_origin(old)} and {_origin(entry)}")

    def _put(self, name: str, entry: T | _Lazy) -> None:
        if not isinstance(entry, _Lazy) or name not in self._entries:  # a string never hides an object
            self._entries[name] = entry

    def _resolve(self, name: str, lazy: _Lazy) -> T:
        module, _, attr = lazy.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ImportError(f"{self.kind} {name}: cannot load {lazy.target} "
                              f"({type(err).__name__}: {err})") from err
        self._entries[name] = obj  # the module's decorator, if any, has put this very object here
        return obj
