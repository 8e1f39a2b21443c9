"""The names SINGA 0.3's binding gives to layers and params it is not told to name.

The binding numbered names from two counters of the process (``LAYERID``, ``PARAMID``): a Dense
layer takes ``layer<n+1>`` and moves the layer counter on, its weight then becomes ``w<n+1>``, a
pooling layer after it ``pool<n+1>`` without moving it.  Names are how params are shared and how a
later job (a stacked RBM) finds an earlier job's params in its checkpoint, so they follow the binding
exactly: the same script gives the same names.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class _Counters:
    layer: int = 0
    param: int = 0


_COUNTERS = _Counters()


def generate_name(label: str, option: int = 0, withnumber: bool = True) -> str:
    """``label`` and a number: ``option`` 1 moves the counter on first (``layer`` and ``param`` have
    their own counters, every other label the layer counter's), 2 names the number after the
    current one without moving the counter; ``withnumber`` False: ``label`` alone."""
    if label == "param":
        if option == 1:
            _COUNTERS.param += 1
        number = _COUNTERS.param
    else:
        if option == 1:
            _COUNTERS.layer += 1
        number = _COUNTERS.layer + 1 if option == 2 and label != "layer" else _COUNTERS.layer
    return f"{label}{number}" if withnumber else label


def reset_names() -> None:
    """Start the numbering afresh, as a new process does (the binding had no such call: a second
    model built in one process continues the numbers of the first)."""
    _COUNTERS.layer = _COUNTERS.param = 0


__all__ = ["generate_name", "reset_names"]
