"""One registry type for everything a job names by a string: layer types, algorithms, updaters,
learning-rate schedules, init methods and store backends.

An entry is registered by a decorator next to its definition (``@LAYERS.register("kReLU")``),
directly (``BACKENDS.register("hdf5", obj=...)``), or as a lazy ``"package.module:Attr"``
string imported on its first lookup, so that a registry can list and find built-ins without
importing their modules up front (which would cost time or make an import cycle).  When that
module is imported, its decorator fulfils the lazy entry with the same object.

Names are free strings: the built-ins use SINGA's enum names, a plugin may use its own.  A job
selects an entry as SINGA 0.3 did (:func:`selected_name`): by its ``user_type`` / ``user_alg``
string when one is written, else by the name of its enum value.
"""
from __future__ import annotations

import dataclasses
import difflib
import importlib
import sys
import weakref
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


_ALL: "weakref.WeakSet[Registry]" = weakref.WeakSet()  # every registry alive (plugins.py snapshots them)


def all_registries() -> list["Registry"]:
    return list(_ALL)


def _registering_module() -> str:
    """The module whose code called into this one (a built-in family, or a user's plugin)."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") == __name__:
        frame = frame.f_back
    return frame.f_globals.get("__name__", "?") if frame is not None else "?"


class DuplicateName(ValueError):
    """A name registered twice (``first``: the ``module:qualname`` that holds it)."""

    def __init__(self, kind: str, name: str, first: str, second: str):
        super().__init__(f"{kind} {name} registered twice: {first} and {second}")
        self.kind, self.name, self.first, self.second = kind, name, first, second


def selected_name(conf, field: str = "type", user_field: str = "user_type") -> str:
    """The registry name a config message selects: its ``user_field`` string when written (SINGA 0.3
    looks a user type up first: layer.cc:57, updater.cc:43/91, param.cc:45, worker.cc:47), else the
    name of its ``field`` enum value (``kUserLayer`` and friends when neither is written)."""
    if conf.HasField(user_field):
        return getattr(conf, user_field)
    enum = conf.DESCRIPTOR.fields_by_name[field].enum_type
    return enum.values_by_number[getattr(conf, field)].name


class Registry(Generic[T]):
    """Names to objects of one kind; unknown names are one-line ConfigErrors listing the valid ones.

    kind:  what an entry is, for programming errors ("layer type", "updater").
    field: what a lookup error calls the name, e.g. the config field it came from
           ("updater.type" gives ``updater.type = kFoo: expected one of kAdaGrad, ...``);
           ``kind`` when not given.

    Two name spaces, as SINGA 0.3's factories kept built-ins by enum value and user code by
    ``user_type`` string: entries registered by singa_mpi's own modules, and entries registered by
    any other module (a plugin).  A plugin may reuse a built-in's name (SINGA's rnnlm registers
    ``user_type: "kEmbedding"`` beside the built-in ``type: kEmbedding``); a config's ``user_type``
    looks only among the plugins' names, its enum ``type`` only among the built-ins.
    """

    def __init__(self, kind: str, field: str | None = None, shared_names: bool = True) -> None:
        self.kind = kind
        self.field = field or kind
        # whether a plugin may reuse a built-in's name: only where a job can say which one it means
        # (a user_type beside the enum); a store backend is one string, which always finds the built-in
        self.shared_names = shared_names
        self._entries: dict[str, T | _Lazy] = {}  # the built-ins
        self._user: dict[str, T | _Lazy] = {}  # registered from outside singa_mpi
        _ALL.add(self)

    @overload
    def register(self, *names: str) -> Callable[[T], T]: ...

    @overload
    def register(self, *names: str, obj: T) -> T: ...

    def register(self, *names: str, obj: T | None = None):
        """Register ``obj`` under every one of ``names`` (aliases); without ``obj``, a decorator that does."""
        if not names:
            raise ValueError(f"{self.kind} registry: register() needs at least one name")
        space = self._space_of_caller()

        def add(entry: T) -> T:
            for name in names:  # check all before adding any: a refused call changes nothing
                self._check_free(space, name, entry)
            for name in names:
                self._put(space, name, entry)
            return entry

        return add if obj is None else add(obj)

    def register_lazy(self, name: str, target: str) -> None:
        """Register ``"package.module:Attr"``; the module is imported on the first ``get(name)``."""
        module, colon, attr = target.partition(":")
        if not (module and colon and attr):
            raise ValueError(f"{self.kind} {name}: lazy target {target!r}: expected 'package.module:Attr'")
        space = self._space_of_caller()
        self._check_free(space, name, _Lazy(target))
        self._put(space, name, _Lazy(target))

    def get(self, name: str, field: str | None = None, user: bool = False) -> T:
        """The object registered as ``name`` (imported now if lazy): a built-in, else a plugin's (only
        a plugin's with ``user``); ConfigError listing the names otherwise (``field`` names where the
        name came from when not ``self.field``, e.g. ``user_type``)."""
        spaces = (self._user,) if user else (self._entries, self._user)
        for space in spaces:
            try:
                entry = space[name]
            except (KeyError, TypeError):  # TypeError: an unhashable name is no name either
                continue
            return self._resolve(space, name, entry) if isinstance(entry, _Lazy) else entry
        raise ConfigError(f"{field or self.field} = {name}: expected {self._expected(user)}") from None

    def _expected(self, user: bool) -> str:
        if user:  # a user_type names what a plugin registered, never a built-in (SINGA's factories kept them apart)
            mine = ", ".join(self.user_names())
            return (f"one of {mine} (what the loaded plugins register)" if mine else
                    f"the name of a plugin's {self.kind} (no loaded plugin registers one: --plugin MODULE_OR_FILE)")
        return f"one of {', '.join(self.names()) or '(none registered)'}"

    def _expected_builtin(self) -> str:
        """For an enum field (``type``, ``alg``): the built-ins, which alone it selects."""
        return f"one of {', '.join(self.builtin_names()) or '(none registered)'}"

    def select(self, conf, field: str = "type", user_field: str = "user_type", where: str = "") -> T:
        """The entry ``conf`` selects (:func:`selected_name`): by its ``user_field`` among the plugins'
        names, else by its enum among the built-ins.  An unknown user name is reported as
        ``<where><user_field> = name`` (``where``: the dotted path of ``conf``, e.g. ``"updater."``)."""
        name = selected_name(conf, field, user_field)
        if conf.HasField(user_field):
            return self.get(name, f"{where}{user_field}", user=True)
        if not conf.HasField(field) and name not in self._entries:
            # neither written: the enum's default (kUserInit, kUserLayer) is a value the user never wrote
            raise ConfigError(f"{self.field} = missing: expected {self._expected_builtin()}")
        try:
            return self.get(name)
        except ConfigError:  # a plugin's names are written in user_field, never offered for the enum
            raise ConfigError(f"{self.field} = {name}: expected {self._expected_builtin()}") from None

    def unregister(self, name: str) -> None:
        """Forget a plugin's ``name`` (a plugin whose import failed half way takes back what it registered)."""
        self._user.pop(name, None)

    def names(self) -> list[str]:
        """Every registered name, built-in or a plugin's, lazy ones included (nothing is imported), sorted."""
        return sorted(set(self._entries) | set(self._user))

    def user_names(self) -> list[str]:
        """The names plugins registered, sorted."""
        return sorted(self._user)

    def close_builtin_names(self, name: str, count: int = 3, cutoff: float = 0.6) -> list[str]:
        """The built-in names nearest ``name`` (a mistyped ``kInnerProdct``: ``kInnerProduct``), best
        first, for a did-you-mean (``cutoff``: difflib's similarity, 0..1); case is ignored, as a
        mistyped case is a typo too."""
        by_lower = {known.lower(): known for known in self.builtin_names()}
        found = difflib.get_close_matches(name.lower(), list(by_lower), n=count, cutoff=cutoff)
        return [by_lower[close] for close in found]

    def builtin_names(self) -> list[str]:
        """The names singa_mpi's own modules registered, sorted: what an enum field (``type``, ``alg``) may name."""
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (name in self._entries or name in self._user)

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}, {len(self)} names)"

    # ------------------------------------------------------------ internals
    def _space_of_caller(self) -> dict[str, T | _Lazy]:
        module = _registering_module()
        return self._entries if module == "singa_mpi" or module.startswith("singa_mpi.") else self._user

    def _check_free(self, space: dict, name: str, entry: T | _Lazy) -> None:
        """ValueError unless ``name`` is free or ``entry`` fulfils (or repeats as a string) its lazy promise."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"{self.kind} registry: name {name!r}: expected a non-empty string")
        if space is self._user and not self.shared_names and name in self._entries:
            raise DuplicateName(self.kind, name, "singa_mpi", _origin(entry))  # a built-in
        old = space.get(name)
        if old is None:
            return
        one_lazy = isinstance(old, _Lazy) != isinstance(entry, _Lazy)
        if not (one_lazy and _origin(old) == _origin(entry)):
            raise DuplicateName(self.kind, name, _origin(old), _origin(entry))

    def _put(self, space: dict, name: str, entry: T | _Lazy) -> None:
        if not isinstance(entry, _Lazy) or name not in space:  # a string never hides an object
            space[name] = entry

    def _resolve(self, space: dict, name: str, lazy: _Lazy) -> T:
        module, _, attr = lazy.target.partition(":")
        try:
            obj = getattr(importlib.import_module(module), attr)
        except (ImportError, AttributeError) as err:
            raise ImportError(f"{self.kind} {name}: cannot load {lazy.target} "
                              f"({type(err).__name__}: {err})") from err
        space[name] = obj  # the module's decorator, if any, has put this very object here
        return obj
