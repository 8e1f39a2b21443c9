"""Both runtimes implement the whole Runtime interface the trainer relies on; every sync strategy
implements SyncStrategy."""
import inspect

import pytest

from singa_mpi.runtimes.base import Runtime
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.runtimes.worker import WorkerRuntime
from singa_mpi.sync.allreduce import AllreduceSync
from singa_mpi.sync.base import LocalSync, SyncStrategy, Synchronizer
from singa_mpi.sync.shared_memory import SharedMemorySync


def _methods(protocol) -> set[str]:
    return {name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("_")}


@pytest.mark.parametrize("cls", [SerialRuntime, WorkerRuntime])
def test_runtimes_implement_the_interface(cls):
    missing = sorted(name for name in _methods(Runtime) if not callable(getattr(cls, name, None)))
    assert not missing, f"{cls.__name__} lacks {missing}"


@pytest.mark.parametrize("cls", [LocalSync, AllreduceSync, SharedMemorySync, Synchronizer])
def test_sync_strategies_implement_the_interface(cls):
    missing = sorted(name for name in _methods(SyncStrategy) if not callable(getattr(cls, name, None)))
    assert not missing, f"{cls.__name__} lacks {missing}"


def test_the_interfaces_are_not_empty():
    assert {"build_net", "sync", "owned_params", "reduce_metrics", "close"} <= _methods(Runtime)
    assert {"layer_done", "gradients_complete", "update", "publish", "owned"} <= _methods(SyncStrategy)
