"""Protobuf's text-format parse errors, reworded for people who write job files.

``FILE:LINE:COL: [layer 'x' (#i, kType): ]field = value: expected ...``: the
layer the error sits in (found by re-tokenizing the text, which works even when
it does not parse), the field as a dotted path below that layer, and, for enum
values, the valid names.  Protobuf's own wording is kept for anything not
recognised here, minus its echo of the source line.  A file that ends inside a
field or a block says so, naming what was still expected.
"""
from __future__ import annotations

import ast
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
_NOT_A_NAME = re.compile(r"Expected identifier or number, got (.+)\.$")
_NO_ENUM_VALUE_AT_END = re.compile(r'Enum type "([\w.]+)" has no value named \.$')
_UNCLOSED = re.compile(r'Expected "([}>])"\.$')  # only at the end of the file: a block never closed
_OPEN_STRING = re.compile(r"String missing ending quote: (.+)$")
_BAD_ESCAPE = re.compile(r"codec can't (?:de|en)code .*: (.+)$")
_NO_EXTENSIONS = re.compile(r'Message type "([\w.]+)" does not have extensions\.$')
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
    at_end = bool(_UNCLOSED.fullmatch(message))
    if message.startswith("'': "):  # the echo of the line protobuf stands on: none past the file's end
        message, at_end = message[4:], True
    elif line and line <= len(lines):
        echo = f"'{lines[line - 1]}': "  # protobuf quotes the whole source line before some errors
        if message.startswith(echo):
            message = message[len(echo):]
    message = " ".join(message.split())  # always one line
    if not line:
        return ConfigError(f"{path}: {message}")
    source = SourceMap(path, text)
    block = _innermost_unclosed(source) if _UNCLOSED.fullmatch(message) else source.enclosing(line, col)
    layer, message = _layer_context(source, block), _explain(message, source, block, line, col, at_end)
    return ConfigError(f"{path}:{line}:{col}: {layer}{message}")


def _innermost_unclosed(source: SourceMap) -> tuple:
    """The block the file ends inside: the innermost one never closed (protobuf points at the last
    token, which may close a block inside it)."""
    unclosed = [path for path, (_, end) in source.spans.items() if end is None]
    return max(unclosed, key=len, default=())


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


def _explain(message: str, source: SourceMap, block: tuple, line: int, col: int, at_end: bool = False) -> str:
    """Reword protobuf's complaint: name the field (dotted, below its layer), the value, what is valid
    (``at_end``: the file ended where the field's value or the block's end was still expected)."""
    field = source.field_before(line, col)
    name = _field_name(field, block[:4] if _in_layer(block) else ()) if field else "value"
    unclosed = _UNCLOSED.fullmatch(message)
    if unclosed:
        return _unclosed(source, block, unclosed.group(1))
    if at_end and field:  # no value to show: say where the file stopped
        return _cut_short(message, name, field)
    explained = _explain_value(message, source, field, name)
    return explained if explained is not None else _explain_syntax(message, source, field, name, block)


def _explain_value(message: str, source: SourceMap, field: tuple | None, name: str) -> str | None:
    """A field's value protobuf refused (a bad enum name, number, string or boolean), or None."""
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
    quote = _OPEN_STRING.search(message)
    if quote:  # protobuf shows the string as Python's repr
        opened = ast.literal_eval(quote.group(1)) if quote.group(1)[:1] in "\"'" else quote.group(1)
        return (f"{name} = {_shown(opened)}: the string has no closing quote: expected {opened[:1]} "
                f"before the line ends (a string ends on the line it starts)")
    escape = _BAD_ESCAPE.search(message)
    if escape:
        return (f"{name}: a bad escape in its string ({escape.group(1)}): expected \\\\ for a backslash, "
                f'\\" for a quote')
    return None


def _explain_syntax(message: str, source: SourceMap, field: tuple | None, name: str, block: tuple) -> str:
    """A field's name or a block protobuf refused (or its own words, where not recognised here)."""
    twice = _TWICE.search(message)
    if twice:
        name = name if field and field[-2] == twice.group(2) else twice.group(2)
        return f"{name}: written twice: expected at most one value (not a repeated field)"
    if message == 'Expected "{".' and field:  # a value where the schema has a message
        value = source.values.get(field)
        return f"{name}{f' = {value}' if value else ''}: expected {{ ... }} around its fields (a block, not a value)"
    if message == 'Expected ":".':
        return f'{name if field else "here"}: expected ":" between the field name and its value'
    if _STRAY_BRACE.search(message):
        return 'unexpected "}": no block is open here (one closing brace too many?)'
    stray = _NOT_A_NAME.search(message)
    if stray:
        return _not_a_name(stray.group(1), block)
    if message == 'Expected ",".':  # inside field: [a, b]
        return f'{name if field else "here"}: expected "," between the items of a [ ... ] list, and "]" after the last'
    if message == 'Expected "]".':  # "[name" read as an extension's name, never closed
        return ('a "[" with no "]" after the name that follows it: expected [extension_name] { ... } (a '
                "plugin's fields), or no \"[\"")
    if message == "Expected identifier.":  # after "[" (or a "." inside [...]): an extension's name
        return ('"[" where a field name belongs: expected a field name, or [extension_name] { ... } for a '
                "plugin's fields")
    no_extensions = _NO_EXTENSIONS.search(message)
    if no_extensions:
        type_name = no_extensions.group(1).split(".")[-1]
        return (f"[...] inside {type_name}, which takes no extensions: expected a field name of {type_name} "
                f"without [ ]")
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


def _unclosed(source: SourceMap, block: tuple, brace: str) -> str:
    """The file ended inside ``block``: name it and where it opened."""
    if not block:
        return f'the file ends inside a block: expected "{brace}" to close it'
    opened = source.spans[block][0]
    layer = _in_layer(block)
    below = "layer" if layer and len(block) == 4 else _field_name(block, block[:4] if layer else ())
    return (f'the file ends inside {below} {{ ... }} opened at line {opened[0]}:{opened[1]}: expected "{brace}" '
            f"to close it")


def _cut_short(message: str, name: str, field: tuple) -> str:
    """The file ended after ``field``'s name, or after its colon: what was still expected."""
    if message == 'Expected ":".':
        return f'{name}: the file ends after the field name: expected ":" and a value'
    if message == 'Expected "{".':
        return f"{name}: the file ends after the field name: expected {{ ... }} around its fields"
    enum = _NO_ENUM_VALUE_AT_END.search(message)
    if enum:
        expected = f"one of {', '.join(_enum_choices(enum.group(1)))}"
    else:  # (the empty value protobuf quotes has gone with the message's trailing space)
        expected = next((what for pattern, what in _VALUE_ERRORS
                         if pattern.search(message) or pattern.search(message + " ")), "a value")
    return f"{name}: the file ends before its value: expected {expected}"


def _not_a_name(got: str, block: tuple) -> str:
    """What protobuf found where a field name belongs (``got``: the token, a string to its line's end)."""
    descriptor = _message_at(block)
    of = f" of {descriptor.name}" if descriptor is not None else ""
    if got[:1] in "\"'":
        return f"{_shown(got)}: a string where a field name belongs: expected a field name{of}, without quotes"
    if got in ("{", "<"):
        return f'"{got}" with no field name before it: expected a field name{of} first (name {{ ... }})'
    return f'"{_shown(got)}" where a field name belongs: expected a field name{of} (name: value, or name {{ ... }})'


def _message_at(block: tuple):
    """The message type of the block at ``block`` (a field path), or None inside an extension's block."""
    descriptor = job_pb2.JobProto.DESCRIPTOR
    for name in block[0::2]:
        field = descriptor.fields_by_name.get(name)
        if field is None or field.message_type is None:
            return None
        descriptor = field.message_type
    return descriptor


def _shown(text: str, most: int = 30) -> str:
    """``text`` as quoted in a message: protobuf takes a string left open to its line's end."""
    return text if len(text) <= most else text[:most] + "..."


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
    return f" (did you mean '{close[0]}'?)" if close else f": expected one of {', '.join(sorted(fields))}"


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
