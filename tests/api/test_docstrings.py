"""Every public name of the Python API and of SINGA 0.3's compatibility layer says what it is: a
docstring on each class and function in their ``__all__``, and on each public method and property
that class defines itself."""
from __future__ import annotations

import inspect

import pytest

import singa_mpi.api as sm
import singa_mpi.compat.singa_v03 as binding


def _public(module) -> list[tuple[str, object]]:
    found = []
    for name in module.__all__:
        thing = getattr(module, name)
        if not (inspect.isclass(thing) or inspect.isfunction(thing)):
            continue
        found.append((f"{module.__name__}.{name}", thing))
        if inspect.isclass(thing):
            for attribute, member in vars(thing).items():
                if attribute.startswith("_"):
                    continue
                if isinstance(member, (classmethod, staticmethod)):
                    member = member.__func__
                if inspect.isfunction(member) or isinstance(member, property):
                    found.append((f"{module.__name__}.{name}.{attribute}", member))
    return found


@pytest.mark.parametrize("module", [sm, binding], ids=lambda m: m.__name__)
def test_every_public_name_has_a_docstring(module):
    missing = [name for name, thing in _public(module) if not (inspect.getdoc(thing) or "").strip()]
    assert missing == []
