"""Protobuf's text-format parse errors, reworded for people who write job files.

``FILE:LINE:COL: [layer 'x' (#i, kType): ]field = value: expected ...``: the
layer the error sits in (found by re-tokenizing the text, which works even when
it does not parse), the field as a dotted path below that layer, and, for enum
values, the valid names.  Protobuf's own wording is kept for anything not
recognised here, minus its echo of the source line.
"""
from __future__ import annotations

import difflib
import re

from google.protobuf import text_format

from singa_mpi.config.retired import RETIRED_LAYER_TYPES, UNWRITTEN_LAYER_TYPES
from singa_mpi.config.source import SourceMap
from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2

_NO_ENUM_VALUE = re.compile(r'Enum type "([\w.]+)" has no value (?:named|with number) (.+?)\.$')
_NO_FIELD = re.compile(r'Message type "([\w.]+)" has no field named "([^"]+)"\.$')
_NO_EXTENSION = re.compile(r'Extension "([\w.]+)" not registered')
_TWICE = re.compile(r'Message type "([\w.]+)" should not have multiple "([^"]+)" fields\.$')
_STRAY_BRACE = re.compile(r"Expected identifier or number, got [}>]\.$")
# enums whose values select built-ins, beside a string field that selects a plugin's entry (SINGA's
# user_type, user_alg): enum -> (the registry's kind, that field, what the user calls an entry)
_PLUGGABLE = {
    "singa.LayerType": ("layer type", "user_type", "layer"),
    "singa.UpdaterType": ("updater", "user_type", "updater"),
    "singa.ChangeMethod": ("learning rate schedule", "user_type", "learning rate schedule"),
    "singa.InitMethod": ("init method", "user_type", "init method"),
    "singa.AlgType": ("algorithm", "user_alg", "algorithm"),
}
_VALUE_ERRORS = [  # (protobuf's complaint about a scalar value, what the field expects)
    (re.compile(r"Couldn't parse integer: (.*)$"), "an integer"),
    (re.compile(r"Couldn't parse (?:float|double): (.*)$"), "a number"),
    (re.compile(r"Expected string but found: '(.*)'$"), 'a "quoted string"'),
    (re.compile(r'Expected "true" or "false"\.$'), "true or false"),
    (re.compile(r"Value out of range: (.*)$"), "a value within the range of the field's type"),
]


def explain_parse_error(err: text_format.ParseError, text: str, path: str) -> ConfigError:
    """``FILE:LINE:COL: [layer 'x' (#i): ]explanation`` for a text-format syntax error."""
    line, col = err.GetLine(), err.GetColumn()
    message = str(err)
    if " : " in message:  # protobuf prefixes "line:col : "
        message = message.split(" : ", 1)[1]
    lines = text.split("\n")  # as protobuf splits them, so a CRLF line matches its echo
    if line and line <= len(lines):
        echo = f"'{lines[line - 1]}': "  # protobuf quotes the whole source line before some errors
        if message.startswith(echo):
            message = message[len(echo):]
    message = " ".join(message.split())  # always one line
    if not line:
        return ConfigError(f"{path}: {message}")
    source = SourceMap(path, text)
    block = source.enclosing(line, col)
    layer, message = _layer_context(source, block), _explain(message, source, block, line, col)
    return ConfigError(f"{path}:{line}:{col}: {layer}{message}")


def _layer_context(source: SourceMap, block: tuple) -> str:
    """``layer 'x' (#i, kType): `` when the error lies inside a layer { ... }."""
    if not _in_layer(block):
        return ""
    layer = block[:4]
    name, type_name = source.value(*layer, "name"), source.value(*layer, "type")
    label = f"'{name}' " if name is not None else ""
    known = type_name in job_pb2.LayerType.keys()
    return f"layer {label}(#{layer[3]}{', ' + type_name if known else ''}): "


def _in_layer(block: tuple) -> bool:
    return len(block) >= 4 and block[:3] == ("neuralnet", 0, "layer")


def _explain(message: str, source: SourceMap, block: tuple, line: int, col: int) -> str:
    """Reword protobuf's complaint: name the field (dotted, below its layer), the value, what is valid."""
    field = source.field_before(line, col)
    name = _field_name(field, block[:4] if _in_layer(block) else ()) if field else "value"
    enum = _NO_ENUM_VALUE.search(message)
    if enum and enum.group(1) == "singa.LayerType" and enum.group(2) in RETIRED_LAYER_TYPES:
        return f"{name} = {enum.group(2)}: expected {RETIRED_LAYER_TYPES[enum.group(2)]}"
    if enum:
        plugged = _plugin_entry(enum.group(1), enum.group(2), source)
        if plugged:  # the enum field takes built-ins only, as SINGA's factories kept the two apart
            user_field, noun = plugged
            return f'{name} = {enum.group(2)}: {enum.group(2)} is a plugin {noun}: write {user_field}: "{enum.group(2)}"'
        choices = _enum_choices(enum.group(1))
        close = _closest(enum.group(2), choices)
        hint = f" (did you mean '{close}'?)" if close else ""
        return f"{name} = {enum.group(2)}: expected one of {', '.join(choices)}{hint}"
    for pattern, expected in _VALUE_ERRORS:
        bad = pattern.search(message)
        if bad:
            value = bad.group(1) if pattern.groups else source.values.get(field, "?")
            return f"{name} = {value}: expected {expected}"
    twice = _TWICE.search(message)
    if twice:
        name = name if field and field[-2] == twice.group(2) else twice.group(2)
        return f"{name}: written twice: expected at most one value (not a repeated field)"
    if message == 'Expected "{".' and field:  # a value where the schema has a message
        value = source.values.get(field)
        return f"{name}{f' = {value}' if value else ''}: expected {{ ... }} around its fields (a block, not a value)"
    if message == 'Expected ":".' and field:
        return f'{name}: expected ":" between the field name and its value'
    if _STRAY_BRACE.search(message):
        return 'unexpected "}": no block is open here (one closing brace too many?)'
    extension = _NO_EXTENSION.search(message)
    if extension:
        from singa_mpi import plugins

        names = [p.spec for p in plugins.loaded()]
        known = f"loaded: {', '.join(names)}" if names else "none loaded"
        return (f"[{extension.group(1)}]: no loaded plugin declares this extension: expected a plugin that does "
                f"(--plugin MODULE_OR_FILE, or plugin: \"...\" in the job; {known})")
    unknown = _NO_FIELD.search(message)
    if unknown:
        message_type, bad_name = unknown.groups()
        name = name if field and field[-2] == bad_name else bad_name
        return f"{name}: unknown field of {message_type.split('.')[-1]}{_field_hint(message_type, bad_name, block)}"
    return message


def _field_hint(message_type: str, bad_name: str, block: tuple) -> str:
    """A missing '}' when an enclosing message has that field, else the closest field name."""
    descriptor = job_pb2.JobProto.DESCRIPTOR
    for name in block[0::2]:
        if bad_name in descriptor.fields_by_name:
            return " (is a '}' missing before it?)"
        field = descriptor.fields_by_name.get(name)
        if field is None or field.message_type is None:  # an extension block: no schema to compare
            break
        descriptor = field.message_type
    fields = job_pb2.DESCRIPTOR.pool.FindMessageTypeByName(message_type).fields_by_name
    close = difflib.get_close_matches(bad_name, list(fields), n=1)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _closest(bad: str, names: list[str]) -> str | None:
    """The name ``bad`` most likely misspells (``kBp`` -> ``kBP``, ``kInnerProdct`` -> ``kInnerProduct``)."""
    by_lower = {name.lower(): name for name in names}
    close = difflib.get_close_matches(bad.lower(), list(by_lower), n=1)
    return by_lower[close[0]] if close else None


def _field_name(path: tuple, base: tuple) -> str:
    """Dotted field names of ``path`` below ``base``: ``pooling_conf.pool``, ``updater.type``."""
    return ".".join(str(part) for part in path[len(base)::2])


def _enum_choices(enum_name: str) -> list[str]:
    """Values worth suggesting: implemented layer types (sorted); otherwise the enum minus kUser*
    placeholders.  Only the enum's own values: a plugin's names go in ``user_type``, never here."""
    enum = job_pb2.DESCRIPTOR.pool.FindEnumTypeByName(enum_name)
    if enum_name == "singa.LayerType":  # from the enum: reading a job file imports no layer (nor numpy)
        return sorted(name for name in enum.values_by_name if not name.startswith("kUser")
                      and name not in RETIRED_LAYER_TYPES and name not in UNWRITTEN_LAYER_TYPES)
    return [value.name for value in enum.values if not value.name.startswith("kUser")]


def _plugin_entry(enum_name: str, value: str, source: SourceMap) -> tuple[str, str] | None:
    """(the field to write, what it names) when ``value`` of an enum field is what a plugin registered.
    The job's plugins load after it parses: here first (``--plugin``, entry points, its ``plugin:``
    lines), as they would next; one that cannot load leaves the job's own error to be reported."""
    pluggable = _PLUGGABLE.get(enum_name)
    if pluggable is None:
        return None
    from singa_mpi import plugins  # deferred: reading a job file imports no plugin machinery unless needed
    from singa_mpi.registry import all_registries

    specs, k = [], 0
    while ("plugin", k) in source.values:
        specs.append(source.values[("plugin", k)])
        k += 1
    try:
        plugins.load_for_job(job_pb2.JobProto(plugin=specs), source.path)
    except ConfigError:  # a plugin that does not load: its own line comes once the job parses
        pass
    kind, user_field, noun = pluggable
    if any(registry.kind == kind and value in registry.user_names() for registry in all_registries()):
        return user_field, noun
    return None
