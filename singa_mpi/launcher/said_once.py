"""Setup's warnings, said once per job.

Every rank reads the same job file and the same data files, and a store is opened twice (its first
batches are checked before step 0, then it is read for training): an ignored `gpu:` field or a torn
record at a kvfile's end used to be said once per rank and per reading.  Setup records its warnings
instead; rank 0 says the union of every rank's, in order; the rest of the run ignores those messages.
A warning the run meets later for the first time is said where it happens.
"""
from __future__ import annotations

import contextlib
import re
import warnings
from typing import Iterator

# (category, message) of one warning: what travels in the phase-1 vote
Said = tuple[type[Warning], str]


@contextlib.contextmanager
def recorded() -> Iterator[list[Said]]:
    """The warnings of the block, kept in the list it yields instead of shown (every one: whether to
    show it is decided by the caller's filters when :func:`say` repeats it)."""
    said: list[Said] = []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            yield said
        finally:
            said.extend((w.category, str(w.message)) for w in caught)


@contextlib.contextmanager
def said_at_the_end() -> Iterator[None]:
    """One process: the block's warnings, each once, when it ends (also by an error)."""
    said: list[Said] = []
    try:
        with recorded() as said:
            yield
    finally:
        say(said)


def union(per_rank: list[list[Said]]) -> list[Said]:
    """Each rank's warnings in rank order, each message once."""
    seen: dict[Said, None] = {}
    for said in per_rank:
        seen.update(dict.fromkeys(said))
    return list(seen)


def say(said: list[Said], speaks: bool = True) -> None:
    """Show ``said`` (where ``speaks``) through the caller's filters, then ignore those messages for
    the rest of the enclosing :func:`warnings.catch_warnings` block (the run's)."""
    for category, message in said:
        if speaks:
            warnings.warn(message, category, stacklevel=2)
        warnings.filterwarnings("ignore", message=re.escape(message) + r"\Z", category=category)
