"""The communicator interface is complete: every method a runtime, sync strategy, server or
connection layer calls on a communicator is in the ``Communicator`` protocol, and both the MPI
communicator and the single-process one implement every method of it (so the server frameworks
run on threads too: tests/runtimes/test_frameworks_in_process.py)."""
import ast
import inspect
import pathlib

import pytest

from singa_mpi.communication.base import Communicator
from singa_mpi.communication.local import LocalComm
from singa_mpi.communication.mpi import MPIComm

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "singa_mpi"
USERS = ["runtimes/worker.py", "runtimes/server.py", "sync/allreduce.py", "sync/shared_memory.py",
         "sync/servers.py", "sync/hogwild.py", "runtimes/exchange.py"]
RECEIVERS = {"comm", "world", "peers", "node", "group"}  # the names communicators go by in those modules


def protocol_methods() -> set[str]:
    return {name for name, value in vars(Communicator).items() if inspect.isfunction(value) and not name.startswith("_")}


def called_on_communicators(path: pathlib.Path) -> set[str]:
    """Methods called as ``<x>.comm.M(...)``, ``self.world.M(...)``, ``comm.M(...)`` and the like."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            if name in RECEIVERS:
                found.add(node.func.attr)
    return found


@pytest.mark.parametrize("cls", [MPIComm, LocalComm])
def test_both_communicators_implement_every_method_of_the_protocol(cls):
    missing = sorted(name for name in protocol_methods() if not callable(getattr(cls, name, None)))
    assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("module", USERS)
def test_what_the_package_calls_on_a_communicator_is_in_the_protocol(module):
    called = called_on_communicators(PACKAGE / module)
    assert called, f"{module}: found no communicator call (the receivers' names changed?)"
    beyond = sorted(m for m in called - protocol_methods() if not m.startswith("_")
                    and m not in {"append", "index", "get", "items", "values", "keys"})
    assert not beyond, f"{module} calls {beyond} on a communicator: expected them in communication.base.Communicator"
