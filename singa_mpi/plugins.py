"""User plugins: Python modules that add layers, algorithms, updaters, learning-rate schedules, init
methods or store backends to the public registries, and the configuration their job files write.

A plugin is an ordinary module whose import registers its entries (``@LAYERS.register("kSwish")``).
It is loaded on every rank before a job is validated, from three places, each at most once per
process:

* installed packages' entry points of group ``singa_mpi.plugins`` (``[project.entry-points]``);
* ``--plugin MODULE_OR_FILE`` on the command line (repeatable; :func:`use` records them);
* the job file's ``plugin: "MODULE_OR_FILE"`` fields (a file relative to the working directory,
  else to the job file's folder).

Configuration reaches user code as SINGA 0.3's protobuf extensions: ``[my_conf] { ... }`` inside a
layer (or the job, updater, ...) parses once a loaded module declares ``my_conf``, either in a
``_pb2`` module compiled from the plugin's own ``.proto`` (``import "job.proto";`` and ``extend
singa.LayerProto``: :data:`sys.modules` maps ``job_pb2`` to this package's schema so such modules
import unchanged), or in Python with :func:`extension`, which needs no protoc.

Failures are one line before any communication (:class:`PluginError`): a missing plugin, one that
raises on import (with the plugin's own file:line), two plugins registering one name.  Ranks that
loaded different plugins are caught by the schedule agreement (:func:`fingerprints`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import importlib.metadata
import os
import sys
import traceback
from types import ModuleType
from typing import Callable, Iterable, Iterator

from google.protobuf import descriptor_pb2, descriptor_pool

from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2
from singa_mpi.registry import DuplicateName, Registry, all_registries

ENTRY_POINT_GROUP = "singa_mpi.plugins"

# a plugin's _pb2 compiled from `import "job.proto"` does `import job_pb2`: the very module in use here
sys.modules.setdefault("job_pb2", job_pb2)


class PluginError(ConfigError):
    """A plugin could not be found, imported or registered (one line, exit code 2)."""


class _NameTaken(PluginError):
    """A plugin file's module name is another module's: that module stays as it is."""


def _file_of(module: ModuleType | None) -> str | None:
    """The real path a module was loaded from ("" for a built-in one), None for no module."""
    if module is None:
        return None
    where = getattr(module, "__file__", None)
    return os.path.realpath(where) if where else ""


@dataclasses.dataclass
class Plugin:
    """One loaded plugin."""

    spec: str  # as written: a module name or a file
    how: str  # "--plugin", "job FILE", "entry point NAME"
    module: str
    origin: str  # the file it was imported from ("" for a namespace package)
    digest: str  # of that file's bytes: ranks that loaded different code disagree
    names: dict[str, list[str]]  # registry kind -> the names it registered
    path: str = ""  # the file or package folder ``spec`` named ("" for a module name)

    def summary(self) -> str:
        what = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in self.names.items()) or "registers nothing"
        return f"plugin {self.spec} ({self.how}): {what}"


_loaded: dict[str, Plugin] = {}  # by module name, in load order
_requested: list[str] = []
_entry_points_loaded = False


def use(specs: Iterable[str] | None) -> None:
    """Record the ``--plugin`` values; they load with the next job (:func:`load_for_job`)."""
    _requested[:] = list(specs or [])


def requested() -> list[str]:
    """The ``--plugin`` values recorded by :func:`use`."""
    return list(_requested)


def loaded() -> list[Plugin]:
    return list(_loaded.values())


def load_for_job(job: job_pb2.JobProto, job_path: str, where: Callable[[int], str] | None = None) -> list[Plugin]:
    """Load what a job needs before it is validated: entry points, ``--plugin`` values, then the job's
    own ``plugin`` fields (``where(k)`` places the k-th in the file for messages)."""
    load_entry_points()
    for spec in _requested:
        load(spec, "--plugin")
    folder = _job_folder(job_path)
    for k, spec in enumerate(job.plugin):
        prefix = f"{where(k)}: " if where is not None else ""
        try:
            load(spec, f"job {job_path}", folder)
        except PluginError as err:
            raise PluginError(f"{prefix}{err}") from None
    return loaded()


def made_portable(job: job_pb2.JobProto, job_path: str | None) -> None:
    """Rewrite ``job``'s ``plugin`` fields that name a file or package folder (found, as when loading,
    in the working directory, else beside ``job_path``) as absolute paths: a copy of the job written
    elsewhere (``plan --auto -o``, the Python API's WORKSPACE/job.conf) then loads the same files.
    Module names, and paths that name nothing, stay as written."""
    folder = _job_folder(job_path)
    for k, spec in enumerate(job.plugin):
        found = _plugin_path(spec, folder)
        if found is not None:
            job.plugin[k] = found


def portable_specs() -> list[str]:
    """Every plugin loaded here as a spec another process loads from any folder (a kernel co-runner
    builds the job's plugin layers): files and package folders by absolute path, modules by name.
    Entry points are left out: such a process loads the installed ones itself."""
    return [plugin.path or plugin.spec for plugin in _loaded.values() if not plugin.how.startswith("entry point")]


def _job_folder(job_path: str | None) -> str | None:
    return os.path.dirname(os.path.abspath(job_path)) if job_path and not job_path.startswith("<") else None


def load_entry_points() -> None:
    """Every installed ``singa_mpi.plugins`` entry point (once per process).  An entry point names a
    module (its import registers) or a function called once with no arguments."""
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        _register(f"{point.name} = {point.value}", f"entry point {point.name}", point.module,
                  lambda point=point: _call_entry_point(point))


def _call_entry_point(point) -> ModuleType:
    target = point.load()
    if not isinstance(target, ModuleType) and callable(target):
        target()
    return sys.modules[point.module]


def load(spec: str, how: str = "--plugin", folder: str | None = None) -> Plugin:
    """Import one plugin: ``spec`` is a module name (``mypkg.layers``) or a ``.py`` file or package
    folder (as written, else under ``folder``); loading the same one again is a no-op."""
    if not isinstance(spec, str) or not spec.strip():
        raise PluginError(f"plugin = {spec!r}: expected a module name or a .py file")
    path = _plugin_path(spec, folder)
    if path is None:
        if _looks_like_path(spec):
            places = "the working directory" + (f" or {folder}" if folder else "")
            raise PluginError(f"plugin {spec}: no such file in {places}: expected a .py file, a package folder "
                              f"or an importable module name")
        module_name = spec
        return _loaded.get(module_name) or _register(spec, how, module_name, lambda: importlib.import_module(spec))
    parent, module_name = _module_of_path(path)
    known = _loaded.get(module_name)
    if known is not None and os.path.realpath(known.origin).startswith(os.path.realpath(path)):
        return known

    taken = _file_of(sys.modules.get(module_name))
    if taken is not None and not taken.startswith(os.path.realpath(path)):  # refused before anything is imported
        raise PluginError(f"plugin {spec}: its module name {module_name!r} is taken by {taken or 'a built-in module'}: "
                          f"expected a file name no other module uses (rename it)")

    def import_file() -> ModuleType:
        added = parent not in sys.path
        if added:
            sys.path.insert(0, parent)  # so that the plugin imports its siblings (its _pb2 module)
        try:
            module = importlib.import_module(module_name)
            found = _file_of(module)
            if not found.startswith(os.path.realpath(path)):  # a built-in module of that name wins over files
                owner = found or "a built-in module"
                raise _NameTaken(f"plugin {spec}: its module name {module_name!r} is taken by {owner}: expected a "
                                 f"file name no other module uses (rename it)")
        except BaseException:
            if added:
                sys.path.remove(parent)
            raise
        return module

    return _register(spec, how, module_name, import_file, path)


def _looks_like_path(spec: str) -> bool:
    return spec.endswith(".py") or os.sep in spec or "/" in spec


def _plugin_path(spec: str, folder: str | None) -> str | None:
    """The file or package folder ``spec`` names, if it is one (as written, then under ``folder``)."""
    for candidate in [spec] + ([os.path.join(folder, spec)] if folder else []):
        if os.path.isfile(candidate) and candidate.endswith(".py"):
            return os.path.abspath(candidate)
        if os.path.isfile(os.path.join(candidate, "__init__.py")):
            return os.path.abspath(candidate)
    return None


def _module_of_path(path: str) -> tuple[str, str]:
    """(folder to put on sys.path, module name) of a plugin file or package folder."""
    path = path.rstrip(os.sep)
    parent, name = os.path.split(path)
    return parent, name[:-3] if name.endswith(".py") else name


def _register(spec: str, how: str, module_name: str, do_import: Callable[[], ModuleType], path: str = "") -> Plugin:
    """Import through ``do_import``, noting what the import registered; on failure undo its
    registrations and raise a one-line PluginError."""
    before = _user_names_now()
    try:
        module = do_import()
    except _NameTaken:
        _undo(before, None)  # the module of that name is not the plugin's: keep it
        raise
    except PluginError:
        _undo(before, module_name)
        raise
    except DuplicateName as err:
        _undo(before, module_name)
        if err.first == "singa_mpi":  # a registry whose names a plugin cannot share (store backends)
            raise PluginError(f"plugin {spec}: {err.kind} {err.name} is a built-in one: expected a name of its own "
                              f"(a job names a {err.kind} by one string, which finds the built-in)") from None
        raise PluginError(f"plugin {spec}: {err.kind} {err.name} is already registered by "
                          f"{_owner_of(err.first)}: expected a name no other plugin uses") from None
    except ModuleNotFoundError as err:
        _undo(before, module_name)
        if err.name == module_name:
            raise PluginError(f"plugin {spec}: no module named {module_name!r}: expected an installed module, one "
                              f"on PYTHONPATH, or a .py file") from None
        raise PluginError(f"plugin {spec}: import failed: {_failure(err)}") from None
    except Exception as err:  # noqa: BLE001 -- anything a user's module raises becomes one line
        _undo(before, module_name)
        raise PluginError(f"plugin {spec}: import failed: {_failure(err)}") from None
    origin = getattr(module, "__file__", "") or ""
    names: dict[str, list[str]] = {}
    for registry in all_registries():
        names.setdefault(registry.kind, []).extend(_user_names(registry, before))
    names = {kind: sorted(found) for kind, found in sorted(names.items()) if found}
    plugin = Plugin(spec, how, module.__name__, origin, _digest(origin), names, path)
    _loaded[module.__name__] = plugin
    return plugin


def _undo(before: dict[int, set[str]], module_name: str | None) -> None:
    """Forget what a failed import registered, and the half-imported module, so that nothing of it lingers."""
    for registry in all_registries():
        for name in _user_names(registry, before):
            registry.unregister(name)
    if module_name is not None:
        sys.modules.pop(module_name, None)


def _owner_of(origin: str) -> str:
    """Who registered an entry, from its ``module:qualname``."""
    module = origin.split(":", 1)[0]
    if module == "singa_mpi" or module.startswith("singa_mpi."):
        return f"singa_mpi (built-in {origin})"
    for plugin in _loaded.values():
        if module == plugin.module or module.startswith(plugin.module + "."):
            return f"plugin {plugin.spec} ({origin})"
    return origin


def _failure(err: BaseException) -> str:
    """``Type: message (file:line)`` at the innermost frame outside the import machinery."""
    frames = [f for f in traceback.extract_tb(err.__traceback__) if "importlib" not in f.filename]
    where = f" ({_short(frames[-1].filename)}:{frames[-1].lineno})" if frames else ""
    if isinstance(err, SyntaxError) and err.filename:
        where = f" ({_short(err.filename)}:{err.lineno})"
    return f"{type(err).__name__}: {err}{where}"


def _short(path: str) -> str:
    relative = os.path.relpath(path)
    return relative if not relative.startswith("..") else path


def _digest(path: str) -> str:
    """Of a module's file, or of every .py file of a package (its __init__.py and what lies below)."""
    digest = hashlib.sha256()
    try:
        if os.path.basename(path) != "__init__.py":
            with open(path, "rb") as f:
                digest.update(f.read())
        else:
            folder = os.path.dirname(path)
            for name in sorted(os.path.join(where, name) for where, _, names in os.walk(folder)
                               for name in names if name.endswith(".py")):
                with open(name, "rb") as f:
                    digest.update(os.path.relpath(name, folder).encode() + b"\0" + f.read())
    except OSError:
        return "-"
    return digest.hexdigest()[:12]


@contextlib.contextmanager
def isolated() -> Iterator[None]:
    """Plugins loaded inside the block are forgotten after it (their registrations, their modules,
    ``--plugin`` values): tests load plugins without leaking names into the next test."""
    loaded_before, requested_before, path_before = dict(_loaded), list(_requested), list(sys.path)
    before = _user_names_now()
    try:
        yield
    finally:
        for module in set(_loaded) - set(loaded_before):
            for name in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
                del sys.modules[name]
        for registry in all_registries():
            for name in _user_names(registry, before):
                registry.unregister(name)
        _loaded.clear()
        _loaded.update(loaded_before)
        _requested[:] = requested_before
        sys.path[:] = path_before  # the folders of file plugins


def fingerprints() -> list[str]:
    """``module digest`` of every loaded plugin, sorted: what the ranks compare before step 1."""
    return sorted(f"{p.module} {p.digest}" for p in _loaded.values())


def _user_names_now() -> dict[int, set[str]]:
    """Every registry's plugin names, by registry (kinds may repeat: a test makes its own registries)."""
    return {id(registry): set(registry.user_names()) for registry in all_registries()}


def _user_names(registry: Registry, before: dict[int, set[str]]) -> list[str]:
    """The plugins' names added to ``registry`` since the snapshot ``before`` (a registry made since
    then had none; a built-in family imported for the first time registers built-ins, not these)."""
    return sorted(set(registry.user_names()) - before.get(id(registry), set()))


# ------------------------------------------------------------ extensions declared in Python

_FIELD_TYPES = {bool: descriptor_pb2.FieldDescriptorProto.TYPE_BOOL,  # before int: a bool is an int
                int: descriptor_pb2.FieldDescriptorProto.TYPE_INT32,
                float: descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT,
                str: descriptor_pb2.FieldDescriptorProto.TYPE_STRING}


def extension(name: str, extends: str = "LayerProto", number: int | None = None, **fields):
    """Declare ``[name] { field: value ... }`` for job files, in Python (no ``.proto``, no protoc).

    ``fields`` give each field's default (``slope=0.01``: a float defaulting to 0.01), or its type
    alone (``path=str``), or a one-element list for a repeated field (``steps=[int]``).  ``extends``
    names the message of ``job.proto`` it extends (``LayerProto``, ``JobProto``, ``UpdaterProto``,
    ``AlgProto``, ...); ``number`` defaults to the highest free one of that message's extension range.
    Returns the extension's descriptor: ``layer.conf.Extensions[it].slope``.  Declaring the same
    extension again (a plugin imported twice) returns the first one."""
    pool = descriptor_pool.Default()
    target = getattr(job_pb2, extends, None)
    if target is None or not target.DESCRIPTOR.extension_ranges:
        raise ValueError(f"extension {name}: extends = {extends!r}: expected a message of job.proto with an "
                         f"extension range, such as LayerProto, JobProto or UpdaterProto")
    file_name = f"singa_mpi_plugins/{name}.proto"
    try:
        return pool.FindFileByName(file_name).extensions_by_name[name]
    except KeyError:
        pass
    file_proto = descriptor_pb2.FileDescriptorProto(name=file_name, syntax="proto2", dependency=["job.proto"])
    message = file_proto.message_type.add(name=_message_name(name))
    for k, (field, spec) in enumerate(fields.items(), start=1):
        message.field.add(**_field(name, field, k, spec))
    file_proto.extension.add(name=name, number=number or _free_number(target.DESCRIPTOR, name),
                             label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL,
                             type=descriptor_pb2.FieldDescriptorProto.TYPE_MESSAGE,
                             type_name=f".{message.name}", extendee=f".{target.DESCRIPTOR.full_name}")
    try:
        return pool.AddSerializedFile(file_proto.SerializeToString()).extensions_by_name[name]
    except TypeError as err:  # a name or number another module declared
        raise ValueError(f"extension {name}: {err}") from None


def _message_name(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_")) + "Message"


def _field(extension_name: str, field: str, number: int, spec) -> dict:
    label = descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
    default = None
    if isinstance(spec, list):
        if len(spec) != 1 or spec[0] not in _FIELD_TYPES:
            raise ValueError(f"extension {extension_name}: {field} = {spec!r}: expected [bool], [int], [float] "
                             f"or [str] for a repeated field")
        kind, label = spec[0], descriptor_pb2.FieldDescriptorProto.LABEL_REPEATED
    elif isinstance(spec, type):
        kind = spec
    else:
        kind, default = type(spec), spec
    if kind not in _FIELD_TYPES:
        raise ValueError(f"extension {extension_name}: {field} = {spec!r}: expected a default or a type among "
                         f"bool, int, float, str")
    entry = {"name": field, "number": number, "label": label, "type": _FIELD_TYPES[kind]}
    if default is not None:
        entry["default_value"] = ("true" if default else "false") if kind is bool else str(default)
    return entry


def _free_number(message, name: str) -> int:
    used = {ext.number for ext in descriptor_pool.Default().FindAllExtensions(message)}
    for start, end in sorted(message.extension_ranges, reverse=True):
        for number in range(end - 1, start - 1, -1):  # end is exclusive
            if number not in used:
                return number
    raise ValueError(f"extension {name}: every extension number of {message.name} is taken")
