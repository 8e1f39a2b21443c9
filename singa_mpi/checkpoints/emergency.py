"""Emergency checkpoints: when a rank dies under ``singa-mpi run --elastic``, the survivors save what
they hold, and the supervisor assembles a checkpoint from it if together they hold everything.

The rank side (:class:`Rescue`): the trainer marks a *rescue point* after each step's update (the
step, and the readers' positions for the next batch), holding :attr:`Rescue.lock` from the update's
start to that mark.  A daemon thread waits for the supervisor's request (a file ``request`` in the
folder named by ``SINGA_MPI_RESCUE``); then it takes the lock, so the params, the updater state and
the mark agree (the main thread is meanwhile computing or blocked in the gradient exchange of the next
step, which changes none of them), writes this rank's piece (``rank<R>.pkl``, atomically) and ends
the process: the main thread, blocked on a dead peer, would never return.

The supervisor side (:func:`assemble`): pieces at the newest step that cover every element of every
param, and for every param the updater state of ranks that *update* it (its owners), make the
checkpoint; it is then written like any other (:func:`singa_mpi.checkpoints.hdf5.write`: atomic,
checksummed, with the job's identity).  What is not covered means that state died with the rank:
a feature-split shard held only there, the chunk of node-shared params whose update it owned, a
server's range; the restart then uses the last periodic checkpoint and says why.
"""
from __future__ import annotations

import os
import pickle
import threading
import time

import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checkpoints.snapshot import job_identity, job_ranks, job_shape, plan_summary, put_region
from singa_mpi.communication.liveness import close_lives, launched_rank
from singa_mpi.data.convert import atomic_path

RESCUE_VARIABLE = "SINGA_MPI_RESCUE"  # the folder of this attempt's request and pieces (set by the supervisor)
REQUEST = "request"
LOCK_TIMEOUT = 10.0  # a main thread that holds the lock longer waits on a dead peer inside its update
EXIT_RESCUED = 0  # a survivor's exit once its piece is saved (nonzero would make MPICH end the others)


def piece_path(folder: str, rank: int) -> str:
    return os.path.join(folder, f"rank{rank}.pkl")


def pieces_in(folder: str) -> list[dict]:
    """The pieces saved in ``folder`` (a piece that cannot be read is left out)."""
    found = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        if name.startswith("rank") and name.endswith(".pkl"):
            try:
                with open(os.path.join(folder, name), "rb") as f:
                    saved = pickle.load(f)
            except (OSError, pickle.UnpicklingError, EOFError, ValueError):
                continue
            found += saved if isinstance(saved, list) else [saved]  # a server saves a piece per step
    return found


def request(folder: str) -> None:
    """The supervisor's call to every rank of the attempt: save what you hold."""
    os.makedirs(folder, exist_ok=True)
    with atomic_path(os.path.join(folder, REQUEST), "the rescue request") as temporary, open(temporary, "w") as f:
        f.write(f"{time.time()}\n")


class Rescue:
    """This rank's part (see the module)."""

    def __init__(self, folder: str, trainer):
        self.folder, self.trainer = folder, trainer
        self.lock = threading.Lock()
        self.step: int | None = None
        self.readers: dict = {}
        self.elapsed = 0.0

    @classmethod
    def from_environment(cls, trainer) -> Rescue | None:
        folder = os.environ.get(RESCUE_VARIABLE)
        return cls(folder, trainer) if folder else None

    def mark(self, step: int) -> None:
        """The state now is the state after ``step`` batches (called under :attr:`lock`, after an update)."""
        self.step = step
        self.readers = {phase: {layer.name: dict(layer.state()) for layer in net.layers if layer.state()}
                        for phase, net in self.trainer.nets().items()}
        self.elapsed = self.trainer.elapsed()

    @property
    def rank(self) -> int:
        """This process's rank in the job (a worker group's runtime counts within its group)."""
        launched = launched_rank()
        return launched[0] if launched is not None else self.trainer.runtime.rank

    def start(self) -> None:
        _on_request(self.folder, self.rank, self._answer)

    def _answer(self) -> dict:
        rank = self.rank
        sync = self.trainer.runtime.sync()
        why = sync.not_rescuable()
        if why:  # at once: waiting for the lock would only delay the restart
            return _refused(rank, why)
        if sync.state_on_servers():  # the servers save the values: only the data position (set with the step)
            return self._piece(values=False) if self.step is not None else _refused(rank, "no step done yet")
        if not self.lock.acquire(timeout=LOCK_TIMEOUT):  # kept: the main thread must not change anything now
            return _refused(rank, f"its update waited on a dead rank for over {LOCK_TIMEOUT:g}s")
        return self._piece() if self.step is not None else _refused(rank, "it had not finished a step yet")

    def _piece(self, values: bool = True) -> dict:
        """Everything this rank holds at the rescue point: every param it holds (replicas too, not only
        those it reports in a periodic checkpoint) and the updater state of those it updates."""
        trainer, runtime = self.trainer, self.trainer.runtime
        held = {id(p): p for p in trainer.train_net.params}.values() if values else ()
        params = [(p.name, tuple(p.logical_shape), ("nd", p.shard), np.array(p.data)) for p in held]
        owned = [(owner.name, tuple(owner.logical_shape), owner.region(), trainer.updater.state(owner.name))
                 for owner in (runtime.owned_params() if values else ())]
        carried = sorted(layer.name for net in trainer.nets().values() for layer in net.layers if layer.carried())
        known = trainer.job_params
        return {"rank": self.rank, "pid": os.getpid(), "step": self.step, "params": params, "owned": owned,
                "readers": self.readers, "counters": trainer.updater.counters(), "carried": carried,
                "refused": None, "elapsed": self.elapsed, "trains": True,
                "expected": {name: tuple(shape) for name, shape in (known or {}).items()},
                "header": {"job_name": trainer.job.name, "job_config": trainer.cfg.text,
                           "plan": plan_summary(trainer.cfg, runtime.size, job_shape(runtime)),
                           "seed": trainer.job.seed, "nranks": job_ranks(runtime),
                           "job_identity": job_identity(trainer.cfg, known) if known is not None else ""}}


def serve_on_request(rank: int, server) -> None:
    """A server rank's part: on the request, its ranges (``server.emergency_pieces()``, under its lock:
    no range half-updated), one piece per step they have reached (each range is updated once all its
    pieces of a step are in, so they need not agree)."""
    folder = os.environ.get(RESCUE_VARIABLE)
    if not folder:
        return

    def answer():
        if not server.lock.acquire(timeout=LOCK_TIMEOUT):
            return _refused(rank, f"a server whose update took over {LOCK_TIMEOUT:g}s")
        found = server.emergency_pieces()
        return _refused(rank, f"a server: {found}") if isinstance(found, str) else found

    _on_request(folder, rank, answer)


def _on_request(folder: str, rank: int, answer) -> None:
    """A daemon thread: wait for the request, save ``answer()`` as this rank's piece, end the process."""

    def watch() -> None:
        path = os.path.join(folder, REQUEST)
        while not os.path.exists(path):
            time.sleep(0.1)
        try:
            piece = answer()
            with atomic_path(piece_path(folder, rank), "an emergency piece") as temporary, open(temporary, "wb") as f:
                pickle.dump(piece, f, protocol=pickle.HIGHEST_PROTOCOL)
        finally:
            close_lives()  # a meant end: the guardian must not report a vanished rank
            os._exit(EXIT_RESCUED)

    threading.Thread(target=watch, name="singa-mpi rescue", daemon=True).start()


def _refused(rank: int, why: str) -> dict:
    return {"rank": rank, "pid": os.getpid(), "step": None, "refused": why}


def assemble(pieces: list[dict]) -> tuple[checkpoint.Checkpoint | None, str]:
    """The newest checkpoint the pieces make whole, and what it came from; or None and why not."""
    usable = [p for p in pieces if p.get("refused") is None]
    refusals = [f"rank {p['rank']}: {p['refused']}" for p in pieces if p.get("refused") is not None]
    if not usable:
        return None, "; ".join(refusals) or "no survivor saved anything"
    carried = sorted({name for p in usable for name in p["carried"]})
    if carried:
        return None, f"layers {', '.join(carried)} carry per-row state across batches, which a dead rank's rows hold"
    why = "no worker saved its data position"
    # not past rank 0's step where it saved one: it writes metrics.jsonl, whose steps must go on without
    # a gap (asynchronous groups, Hogwild, may be ahead of it; synchronous ranks are not)
    root = [p["step"] for p in usable if p["rank"] == 0 and p.get("trains")]
    for step in sorted({p["step"] for p in usable if not root or p["step"] <= root[0]}, reverse=True):
        at = [p for p in usable if p["step"] == step]
        if not any(p.get("trains") for p in at):
            continue  # servers' ranges ahead of every worker (updated with the dead worker's gradient)
        ckpt, why = _whole(at, step)
        ahead = sorted({(p["rank"], p["step"]) for p in usable for name, *_ in p["params"]
                        if p["step"] != step and f"param {name} " in why})
        if ahead:
            rank, other = ahead[0]
            why = (f"{why.split(' was ', 1)[0]} was at step {other} on rank {rank}, the workers at step {step} "
                   f"(a server had applied the dead worker's gradient)")
        if ckpt is not None:
            ranks = ", ".join(str(r) for r in sorted({p["rank"] for p in at}))
            return ckpt, f"step {step}, from what ranks {ranks} held{_left_out(usable, refusals, step)}"
    return None, "; ".join([why] + refusals)


def _left_out(usable: list[dict], refusals: list[str], step: int) -> str:
    """The other survivors, and why the checkpoint does not use them: a worker whose step was another
    (a collective the dead rank left half done lets some ranks finish a step and not others), or a
    refusal; "" when every survivor's piece is in."""
    elsewhere = sorted({(p["rank"], p["step"]) for p in usable if p.get("trains") and p["step"] != step})
    notes = [f"rank {rank} was at step {other}" for rank, other in elsewhere] + refusals
    return f" ({'; '.join(notes)})" if notes else ""


def _whole(pieces: list[dict], step: int) -> tuple[checkpoint.Checkpoint | None, str]:
    trained = [p for p in pieces if p.get("trains")]
    expected = dict(trained[0]["expected"])
    for piece in pieces:
        for name, shape, _, _ in piece["params"]:
            expected.setdefault(name, shape)
    values = {name: np.zeros(shape, np.float32) for name, shape in expected.items()}
    held = {name: np.zeros(shape, bool) for name, shape in expected.items()}
    updated = {name: np.zeros(shape, bool) for name, shape in expected.items()}
    ckpt = checkpoint.Checkpoint(step=step, params=values, **trained[0]["header"])
    ckpt.elapsed = max(p["elapsed"] for p in pieces)
    for piece in pieces:
        for name, _, region, value in piece["params"]:
            put_region(values[name], region, value)
            put_region(held[name], region, np.ones(value.shape, bool))
        for name, shape, region, slots in piece["owned"]:
            put_region(updated[name], region, np.ones(_region_shape(shape, region), bool))
            for slot, value in slots.items():
                target = ckpt.updater.setdefault(name, {}).setdefault(slot, np.zeros(shape, np.float32))
                put_region(target, region, value)
            if name in piece["counters"]:
                ckpt.counters[name] = dict(piece["counters"][name])
        for phase, layers in piece["readers"].items():
            ckpt.readers.setdefault(phase, {}).update(layers)
    for name in sorted(expected):
        if not held[name].all():
            return None, f"param {name} was held in part by the dead rank alone ({_share(held[name])} held by survivors)"
        if not updated[name].all():
            return None, (f"the updater state of param {name} was kept by the dead rank or by server ranks "
                          f"(the survivors that saved update {_share(updated[name])} of it)")
    return ckpt, ""


def _region_shape(shape: tuple, region: tuple) -> tuple:
    if region[0] == "flat":
        return (region[2] - region[1],)
    return tuple(hi - lo for lo, hi in region[1])


def _share(mask: np.ndarray) -> str:
    return f"{mask.mean():.0%}"


__all__ = ["RESCUE_VARIABLE", "Rescue", "serve_on_request", "assemble", "pieces_in", "piece_path", "request"]
