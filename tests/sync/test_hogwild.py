"""Hogwild's exchange between worker groups (GroupDeltaSync), one group's side, with the other
groups' deltas given by a stand-in for the Iallreduce."""
import tracemalloc

import numpy as np

from singa_mpi.params import Param
from singa_mpi.proto import job_pb2
from singa_mpi.sync.hogwild import GroupDeltaSync

SHAPES = [(300, 200), (300,), (50, 300), (50,)]


class OtherGroups:
    """Iallreduce adds what the other groups changed since the last exchange (``deltas``, one per call)."""

    def __init__(self, deltas):
        self.deltas = list(deltas)

    def Iallreduce(self, array, label):
        array += self.deltas.pop(0)
        return object()

    def Wait(self, request, label, what):
        pass


def params(seed=0):
    rng = np.random.default_rng(seed)
    made = []
    for i, shape in enumerate(SHAPES):
        param = Param(job_pb2.ParamProto(name=f"p{i}"), shape, tuple((0, n) for n in shape))
        param.data[...] = rng.standard_normal(shape)
        made.append(param)
    return made


def flat(made):
    return np.concatenate([p.data.reshape(-1) for p in made])


def test_each_exchange_adds_the_other_groups_changes_once():
    made = params()
    size = sum(p.data.size for p in made)
    rng = np.random.default_rng(1)
    others = [rng.standard_normal(size).astype(np.float32) for _ in range(3)]
    sync = GroupDeltaSync(OtherGroups(others), None, made, sync_freq=2)
    expected = flat(made)
    for step in range(6):  # exchanges after steps 1, 3 and 5: each adds the others' deltas of the one before
        own = rng.standard_normal(size).astype(np.float32)
        for param, lo in zip(made, np.cumsum([0] + [p.data.size for p in made])):
            param.data.reshape(-1)[...] += own[lo:lo + param.data.size]
        expected += own
        sync.update(step, None)
        sync.publish()
        if step in (3, 5):
            expected += others[(step - 3) // 2]
        np.testing.assert_allclose(flat(made), expected, rtol=1e-5, atol=1e-5)


def test_an_exchange_allocates_nothing_the_size_of_the_model():
    """The deltas are taken and the others' changes added param by param, in place: a copy of every
    param end to end (44 MiB for an MLP of 11.5M weights) each exchange cost time and memory."""
    made = params()
    model_bytes = sum(p.data.nbytes for p in made)
    sync = GroupDeltaSync(OtherGroups([np.zeros(model_bytes // 4, np.float32)] * 4), None, made, sync_freq=1)
    sync.update(0, None)
    sync.publish()  # the first exchange starts
    tracemalloc.start()
    try:
        sync.update(1, None)
        sync.publish()  # the first one finishes, the second starts
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < model_bytes // 4, f"an exchange allocated {peak} bytes for a model of {model_bytes}"
