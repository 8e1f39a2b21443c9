"""Where each field of a protobuf text-format file was written.

Python's text_format parser keeps no positions, so this module tokenizes the
text once more and records the line and column of every field name under its
path, e.g. ``("neuralnet", 0, "layer", 3, "convolution_conf", 0, "kernel", 0)``
(the integers count the occurrences of a field name within its parent).
Error messages then point at ``FILE:LINE:COL`` of the offending field.

The tokenizer also works on text that does not parse, so a syntax error can
still be placed inside the layer it occurs in (:meth:`SourceMap.enclosing`).
"""
from __future__ import annotations

import dataclasses
import re

# identifiers, [extension.names], strings, numbers, punctuation; comments skipped
_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+) | (?P<newline>\n) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<ext>\[[ \t]*[A-Za-z_][A-Za-z0-9_./]*[ \t]*\])
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>[-+]?0[xX][0-9a-fA-F]+|[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|[-+]?(?:inf|nan))
  | (?P<punct>[{}<>:,;\[\]\-])
  | (?P<other>.)
    """,
    re.VERBOSE,
)

Path = tuple
Position = tuple  # (line, column), both 1-based


@dataclasses.dataclass
class _Token:
    kind: str
    text: str
    pos: Position


@dataclasses.dataclass
class _Frame:
    """An open message ``{ ... }``, or an open list ``field: [ ... ]`` (list_field set)."""

    path: Path
    counts: dict[str, int]
    list_field: str | None = None
    parent: "_Frame | None" = None


class SourceMap:
    """Positions of the fields of one text-format file.

    positions: field path -> position of the field name.
    values:    field path -> text of a scalar value as written (quotes removed from strings).
    spans:     message path -> (position of its ``{``, position of its ``}`` or None if never closed).
    """

    def __init__(self, path: str, text: str):
        self.path = path
        self.positions: dict[Path, Position] = {}
        self.values: dict[Path, str] = {}
        self.spans: dict[Path, tuple[Position, Position | None]] = {}
        self._index(text)

    @staticmethod
    def _tokens(text: str) -> list[_Token]:
        tokens, line, line_start = [], 1, 0
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "newline":
                line, line_start = line + 1, m.end()
            elif kind not in ("space", "comment"):
                tokens.append(_Token(kind, m.group(), (line, m.start() - line_start + 1)))
        return tokens

    def _index(self, text: str) -> None:
        tokens = self._tokens(text)
        stack = [_Frame((), {})]
        i = 0
        while i < len(tokens):
            token, frame = tokens[i], stack[-1]
            if frame.list_field is not None:
                i = self._list_item(tokens, i, stack)
            elif token.text in ("}", ">"):
                if len(stack) > 1:
                    self._close(stack.pop(), token.pos)
                i += 1
            elif token.kind in ("word", "ext"):
                i = self._field(tokens, i, stack)
            else:  # stray punctuation (`;`, `,`) or a syntax error: the parser reports those
                i += 1

    def _occurrence(self, frame: _Frame, name: str, pos: Position) -> Path:
        count = frame.counts.get(name, 0)
        frame.counts[name] = count + 1
        path = frame.path + (name, count)
        self.positions[path] = pos
        return path

    def _open(self, stack: list[_Frame], path: Path, brace: _Token) -> None:
        self.spans[path] = (brace.pos, None)
        stack.append(_Frame(path, {}))

    def _close(self, frame: _Frame, pos: Position) -> None:
        self.spans[frame.path] = (self.spans[frame.path][0], pos)

    def _field(self, tokens: list[_Token], i: int, stack: list[_Frame]) -> int:
        """Record the field name at ``i``; return the index after its value (or after its ``{``)."""
        name = tokens[i].text
        if tokens[i].kind == "ext":
            name = f"[{name[1:-1].strip()}]"
        path = self._occurrence(stack[-1], name, tokens[i].pos)
        j = i + 1
        if j < len(tokens) and tokens[j].text == ":":
            j += 1
        if j < len(tokens) and tokens[j].text in ("{", "<"):
            self._open(stack, path, tokens[j])
            return j + 1
        if j < len(tokens) and tokens[j].text == "[":  # field: [a, b] or field: [{...}, {...}]
            # each item is an occurrence of the field, positioned at the item itself
            del self.positions[path]
            stack[-1].counts[name] -= 1
            stack.append(_Frame(stack[-1].path, {}, list_field=name, parent=stack[-1]))
            return j + 1
        return self._scalar(tokens, j, path)

    def _list_item(self, tokens: list[_Token], i: int, stack: list[_Frame]) -> int:
        """One token inside ``field: [ ... ]``: each item is an occurrence of the field.

        Always moves on (the text may not parse): anything but an item or ``]`` is skipped,
        and a ``}`` ends the unclosed list so that it can close the enclosing message.
        """
        token, frame = tokens[i], stack[-1]
        if token.text in ("]", "}", ">"):
            stack.pop()
            return i + 1 if token.text == "]" else i
        if token.text in ("{", "<"):
            self._open(stack, self._occurrence(frame.parent, frame.list_field, token.pos), token)
            return i + 1
        if token.kind in ("string", "word", "number", "ext") or token.text == "-":
            path = self._occurrence(frame.parent, frame.list_field, token.pos)
            return max(self._scalar(tokens, i, path), i + 1)
        return i + 1  # a comma, or a syntax error that the parser reports

    def _scalar(self, tokens: list[_Token], j: int, path: Path) -> int:
        """Index after a scalar value starting at ``j``; remember the value's text."""
        if j < len(tokens) and tokens[j].kind == "ext":  # a one-identifier list: include: [kTrain]
            self.values[path] = tokens[j].text[1:-1].strip()
            return j + 1
        sign = ""
        if j < len(tokens) and tokens[j].text == "-":
            sign, j = "-", j + 1
        if j >= len(tokens) or tokens[j].kind not in ("string", "word", "number"):
            return j  # not a value: a syntax error that the parser reports
        value = tokens[j].text
        j += 1
        # adjacent string literals concatenate in text format
        while j < len(tokens) and tokens[j].kind == "string" and value[:1] in "\"'":
            value, j = value[:-1] + tokens[j].text[1:], j + 1
        self.values[path] = sign + (value[1:-1] if value[:1] in "\"'" and len(value) > 1 else value)
        return j

    # ------------------------------------------------------------------ queries

    def _path(self, fields) -> list[Path]:
        """The successive prefixes of ``fields`` (names alternating with optional indices)."""
        path: list = []
        prefixes = []
        items = list(fields)
        k = 0
        while k < len(items):
            name = str(items[k])
            index = 0
            if k + 1 < len(items) and isinstance(items[k + 1], int):
                index = items[k + 1]
                k += 1
            k += 1
            parts = [name] if name.startswith("[") else name.split(".")  # [ext.names] keep their dots
            for n, part in enumerate(parts):
                path += [part, index if n == len(parts) - 1 else 0]
                prefixes.append(tuple(path))
        return prefixes

    def find(self, *fields) -> Position | None:
        """Position of the longest existing prefix of ``fields``.

        ``fields`` alternates names and optional occurrence indices:
        ``find("neuralnet", "layer", 3, "convolution_conf", "kernel")``; a dotted
        name (``"store_conf.batchsize"``) is a path of fields, the index applying
        to its last part.
        """
        best = None
        for prefix in self._path(fields):
            pos = self.positions.get(prefix)
            if pos is None:
                return best
            best = pos
        return best

    def value(self, *fields) -> str | None:
        """The scalar value written for exactly ``fields``, or None."""
        prefixes = self._path(fields)
        return self.values.get(prefixes[-1]) if prefixes else None

    def where(self, *fields) -> str:
        """``FILE:LINE:COL`` of the field (or of its nearest written ancestor)."""
        pos = self.find(*fields)
        if pos is None:
            return f"{self.path}"
        return f"{self.path}:{pos[0]}:{pos[1]}"

    def enclosing(self, line: int, col: int) -> Path:
        """Path of the innermost message whose braces contain (line, col); () for the top level."""
        best: Path = ()
        for path, (start, end) in self.spans.items():
            if start <= (line, col) and (end is None or (line, col) <= end) and len(path) > len(best):
                best = path
        return best

    def field_before(self, line: int, col: int) -> Path | None:
        """Path of the last field name written at or before (line, col)."""
        best, best_pos = None, None
        for path, pos in self.positions.items():
            if pos <= (line, col) and (best_pos is None or pos > best_pos):
                best, best_pos = path, pos
        return best
