"""Where each field of a protobuf text-format file was written.

Python's text_format parser keeps no positions, so this module tokenizes the
text once more and records the line and column of every field name under its
path, e.g. ``("neuralnet", 0, "layer", 3, "convolution_conf", 0, "kernel", 0)``
(the integers count the occurrences of a field name within its parent).
Error messages then point at ``FILE:LINE:COL`` of the offending field.
"""
from __future__ import annotations

import re

# identifiers, [extension.names], strings, numbers, punctuation; comments skipped
_TOKEN = re.compile(
    r"""
    (?P<space>[ \t\r\f\v]+) | (?P<newline>\n) | (?P<comment>\#[^\n]*)
  | (?P<string>"(?:[^"\\\n]|\\.)*"|'(?:[^'\\\n]|\\.)*')
  | (?P<ext>\[[^\]\n]*\])
  | (?P<word>[A-Za-z_][A-Za-z0-9_.]*)
  | (?P<number>[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?[fF]?|[-+]?(?:inf|nan))
  | (?P<punct>[{}<>:,;\-])
  | (?P<other>.)
    """,
    re.VERBOSE,
)

Path = tuple


class SourceMap:
    """Positions of the fields of one text-format file."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.positions: dict[Path, tuple[int, int]] = {}
        self._index(text)

    def _tokens(self, text: str):
        line, line_start = 1, 0
        for m in _TOKEN.finditer(text):
            kind = m.lastgroup
            if kind == "newline":
                line, line_start = line + 1, m.end()
            elif kind not in ("space", "comment"):
                yield kind, m.group(), line, m.start() - line_start + 1

    def _index(self, text: str) -> None:
        tokens = list(self._tokens(text))
        # stack of (path of the enclosing message, occurrence counts of its fields)
        stack: list[tuple[Path, dict[str, int]]] = [((), {})]
        i = 0
        while i < len(tokens):
            kind, value, line, col = tokens[i]
            if value in ("}", ">"):
                if len(stack) > 1:
                    stack.pop()
                i += 1
                continue
            if kind not in ("word", "ext"):
                i += 1
                continue
            parent, counts = stack[-1]
            count = counts.get(value, 0)
            counts[value] = count + 1
            path = parent + (value, count)
            self.positions[path] = (line, col)
            j = i + 1
            if j < len(tokens) and tokens[j][1] == ":":
                j += 1
            if j < len(tokens) and tokens[j][1] in ("{", "<"):
                stack.append((path, {}))
                i = j + 1
            else:
                i = self._skip_value(tokens, j)

    @staticmethod
    def _skip_value(tokens, j: int) -> int:
        """Index after a scalar value or a [a, b, c] list."""
        if j < len(tokens) and tokens[j][0] == "ext":  # a short list written as [1, 2]
            return j + 1
        if j < len(tokens) and tokens[j][1] == "-":
            j += 1
        j += 1
        # adjacent string literals concatenate in text format
        while j < len(tokens) and tokens[j][0] == "string":
            j += 1
        return j

    def find(self, *fields) -> tuple[int, int] | None:
        """Position of the longest existing prefix of ``fields``.

        ``fields`` alternates names and optional occurrence indices:
        ``find("neuralnet", "layer", 3, "convolution_conf", "kernel")``.
        """
        path: list = []
        best = None
        items = list(fields)
        k = 0
        while k < len(items):
            name = items[k]
            index = 0
            if k + 1 < len(items) and isinstance(items[k + 1], int):
                index = items[k + 1]
                k += 1
            k += 1
            for part in str(name).split("."):
                path += [part, index if part == str(name).split(".")[-1] else 0]
                pos = self.positions.get(tuple(path))
                if pos is None:
                    return best
                best = pos
        return best

    def where(self, *fields) -> str:
        """``FILE:LINE:COL`` of the field (or of its nearest written ancestor)."""
        pos = self.find(*fields)
        if pos is None:
            return f"{self.path}"
        return f"{self.path}:{pos[0]}:{pos[1]}"
