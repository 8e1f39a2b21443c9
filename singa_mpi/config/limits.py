"""Resource limits on job files, checked in one linear pass before protobuf parses the text.

protobuf's text parser (and :class:`singa_mpi.config.source.SourceMap`) cost far more than the
file's size on hostile input: 2,000 nested blocks recursed past Python's stack, 20,000 took 17 s
and 3.2 GB, a 10 MB string literal peaked at 2.4 GB, 870k layers ran for minutes.  Real jobs are
a few kilobytes, nest five blocks deep and name a few hundred layers at most, so each limit below
sits far above any job people write or generate, and far below where the cost starts to hurt.
An error names the limit and where the file crosses it:
``FILE:LINE:COL: blocks nested 101 deep: expected at most 100 (singa_mpi's limit on job files)``.
"""
from __future__ import annotations

import dataclasses
import re

from singa_mpi.errors import ConfigError

# the example jobs are 1-5 KB; MAX_LAYERS layers of ~300 bytes each fit
MAX_JOB_BYTES = 4 * 1024 * 1024
# jobs nest 4-5 blocks (neuralnet > layer > param > init); protobuf's parser recurses once per block
MAX_NESTING = 100
# the longest strings in a job are file paths (PATH_MAX is 4,096 bytes on Linux) and layer names
MAX_TOKEN_CHARS = 64 * 1024
# the largest nets SINGA described had a few hundred layers; unrolled copies are limited in unroll.py
MAX_LAYERS = 10_000

LIMIT_NOTE = "singa_mpi's limit on job files"

# the tokens that matter (blanks and anything else are skipped by the search): a field name with its
# colon and scalar value is one token.  A string literal is matched whole, possessively (a backtracking
# pattern would keep state for every character), up to its closing quote or the end of its line.
_STRING = r""" "[^"\\\n]*+(?:\\.[^"\\\n]*+)*+"? | '[^'\\\n]*+(?:\\.[^'\\\n]*+)*+'? """
_TOKEN = re.compile(rf"""
    (?P<word>[\w.+-]+)                                      # a field name, identifier or number
    (?:\s*(?P<colon>:)(?:\s*(?P<value>[\w.+-]+|{_STRING}))?)?  # its colon and scalar value
  | (?P<string>{_STRING})
  | (?P<open>[{{<])
  | (?P<close>[}}>])
  | (?P<list>\[)
  | (?P<end_list>\])
  | (?P<comment>\#[^\n]*)
  | (?P<other>[^\s\w.+\-"'{{}}<>\[\]\#])
""", re.VERBOSE)


@dataclasses.dataclass
class _Frame:
    """An open ``{``/``<`` block or ``[`` list, with the field name written before it."""

    kind: str  # "{" or "["
    name: str


def check_size(size: int, path: str, unit: str = "bytes") -> None:
    """ConfigError when a job file (``size`` bytes, or characters of a text) exceeds MAX_JOB_BYTES.
    A reader stops at MAX_JOB_BYTES + 1 bytes (a pipe has no size to ask for): that says "more than"."""
    if size > MAX_JOB_BYTES:
        amount = f"more than {MAX_JOB_BYTES:,}" if size == MAX_JOB_BYTES + 1 else f"{size:,}"
        raise ConfigError(f"{path}: {amount} {unit}: expected a job file of at most {MAX_JOB_BYTES:,} bytes "
                          f"({MAX_JOB_BYTES // (1024 * 1024)} MiB, {LIMIT_NOTE})")


def check_text(text: str, path: str) -> None:
    """ConfigError ``FILE:LINE:COL: ...`` for the first limit ``text`` crosses; time linear in the text.

    The scan ignores syntax errors (protobuf reports those after it): an unbalanced ``}`` or an
    unterminated string only ends what it would end."""
    check_size(len(text), path, "characters")
    stack: list[_Frame] = []
    layers = 0
    name, after = "", ""  # the last field name, and the kind of token just before this one
    for m in _TOKEN.finditer(text):
        kind = m.lastgroup
        if m.end() - m.start() > MAX_TOKEN_CHARS:
            _check_lengths(text, m, path)
        if kind in ("word", "colon", "value"):
            name, after = m.group("word"), kind
            continue
        if kind == "comment":
            continue
        if kind == "open":
            field = stack[-1].name if stack and stack[-1].kind == "[" and after != "colon" else name
            _check_depth(text, m.start(), path, stack)
            if field == "layer" and _inside_neuralnet(stack):
                layers += 1
                if layers > MAX_LAYERS:
                    raise _error(text, m.start(), path, f"layer #{layers - 1}: more than {MAX_LAYERS:,} layers in "
                                                        f"neuralnet: expected at most {MAX_LAYERS:,}")
            stack.append(_Frame("{", field))
        elif kind == "close" and stack and stack[-1].kind == "{":
            stack.pop()
        elif kind == "list":
            _check_depth(text, m.start(), path, stack)
            stack.append(_Frame("[", name if after == "colon" else ""))
        elif kind == "end_list" and stack and stack[-1].kind == "[":
            if not stack.pop().name:  # `[ext.name]`, not after a colon: the name of an extension field
                name = "[extension]"
        after = kind


def _check_lengths(text: str, m: re.Match, path: str) -> None:
    """The words, numbers and string literals of a long token ``m``: at most MAX_TOKEN_CHARS characters each."""
    for group in ("word", "value", "string"):
        start = m.start(group)
        if start >= 0 and m.end(group) - start > MAX_TOKEN_CHARS:
            what = "string literal" if text[start] in "\"'" else "word or number"
            raise _error(text, start, path, f"{what} of more than {MAX_TOKEN_CHARS:,} characters: expected at "
                                            f"most {MAX_TOKEN_CHARS:,}")


def _check_depth(text: str, index: int, path: str, stack: list[_Frame]) -> None:
    """A block (or a ``[...]`` list: protobuf recurses into those too) opened at ``index``."""
    if len(stack) >= MAX_NESTING:
        raise _error(text, index, path, f"blocks nested {len(stack) + 1} deep: expected at most {MAX_NESTING}")


def _inside_neuralnet(stack: list[_Frame]) -> bool:
    """Directly inside the top-level ``neuralnet`` block, or in a ``layer: [...]`` list there."""
    return (bool(stack) and stack[0].kind == "{" and stack[0].name == "neuralnet"
            and (len(stack) == 1 or (len(stack) == 2 and stack[1].kind == "[")))


def _error(text: str, index: int, path: str, message: str) -> ConfigError:
    line = text.count("\n", 0, index) + 1
    column = index - (text.rfind("\n", 0, index) + 1) + 1
    return ConfigError(f"{path}:{line}:{column}: {message} ({LIMIT_NOTE})")
