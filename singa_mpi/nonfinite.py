"""The non-finite check: a NaN or an infinity stops the run at the step where it first appears.

On each rank the trainer looks, in the order a step makes them, at

1. the input layers' batches (``RecordInput.nonfinite``: the record that held one),
2. the metrics the loss and output layers have summed since they were last reported (their
   ``sums``: a sum turns non-finite at the step one term does, so this is every step's loss),
3. the summed gradients this rank is about to apply (``Synchronizer.nonfinite_grad``, between the
   sums and the update),
4. the values this rank updated, after a step whose state a checkpoint keeps (an update with
   finite gradients can still overflow float32): no checkpoint holds a NaN or an infinity.  Other
   steps skip this scan; an overflowed value shows in the next step's loss or gradients.

The initial values are looked at once before the first step (a checkpoint at step 0 would keep
them).  While the check is on, numpy's own overflow and invalid-value warnings are silenced: the
check reports the first such value, with its step and layer, instead.

A finding is local.  The ranks vote on it in the vote the trainer takes after every step anyway
(stop signals); only when that vote says stop do they gather the findings, and then every rank
raises :class:`NonFiniteError` at the same step, before any checkpoint is written.  The message
(the root's) names the earliest finding: input before loss before gradient, then the lowest rank.
"""
from __future__ import annotations

import contextlib
import dataclasses
import math

import numpy as np

from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import JobConfig
from singa_mpi.errors import NonFiniteError
from singa_mpi.net import Net, phase_nodes
from singa_mpi.sync.base import first_bad_value, first_nonfinite

INPUT, LOSS, GRADIENT, VALUES = range(4)  # the stages of a step, in the order they make values
SWITCH = "--no-check-finite"  # the command's switch that turns the check off


def advice(stage: int, switch: str = SWITCH) -> str:
    """What to do about a finding of ``stage``; ``switch``: how the caller turns the check off (the
    command's flag, or the Python API's ``fit(..., check_finite=False)``)."""
    off = f"pass {switch}" if switch.startswith("-") else f"use {switch}"
    if stage == INPUT:
        return f"clean the store (or {off} to train on it anyway)"
    return (f"the training diverged or its data or initial values are bad: try a lower learning rate or "
            f"gradient clipping (or {off} to run on regardless)")



@dataclasses.dataclass(frozen=True)
class GroupFinding:
    """A worker group's own finding, as its root raised it: with several groups the job's root joins
    every group's into the job's one line (:func:`job_line`)."""

    group: int
    step: int
    phase: str
    on_rank: str  # " on rank 1" (of the group), or ""
    text: str
    stage: int
    switch: str = SWITCH  # how the run's caller turns the check off


@dataclasses.dataclass(order=True)
class Finding:
    stage: int  # INPUT, LOSS, GRADIENT or VALUES: an earlier stage is the cause of the later ones
    rank: int
    text: str  # "input layer 'data': record 17 of data.h5, value 5 is nan in the store"


def param_owners(cfg: JobConfig) -> dict[str, str]:
    """Param name -> the (first) layer of the train net that declares it."""
    owners: dict[str, str] = {}
    for node in phase_nodes(cfg, "train"):
        for param in node.conf.param:
            owners.setdefault(param.name, node.name)
    return owners


class NonFiniteCheck:
    """What this rank found (its first finding), and the collective verdict on it."""

    def __init__(self, cfg: JobConfig, rank: int):
        self.enabled = True
        self.switch = SWITCH  # how the caller turns the check off, as its messages say it
        self.rank = rank
        self.found: Finding | None = None
        self.owners = param_owners(cfg)
        self._watched: dict[int, tuple[list, list]] = {}  # id(net) -> (its input layers, its metric layers)

    def switch_off(self, nets: list[Net]) -> None:
        """No checks (``--no-check-finite``): the input layers stop looking too."""
        self.enabled = False
        for net in nets:
            for layer in self._watch(net)[0]:
                layer.check_finite = False

    def _watch(self, net: Net) -> tuple[list, list]:
        if id(net) not in self._watched:
            inputs = [layer for layer in net.layers if hasattr(layer, "check_finite")]
            summing = [layer for layer in net.layers if isinstance(getattr(layer, "sums", None), dict)]
            self._watched[id(net)] = (inputs, summing)
        return self._watched[id(net)]

    def _note(self, stage: int, text: str) -> None:
        self.found = Finding(stage, self.rank, text)  # the first only: each look returns once one is noted

    # -------------------------------------------------------------- looking (local)
    def look_at_layers(self, net: Net) -> None:
        """After a forward pass: the input layers' batches and the metric sums so far."""
        if not self.enabled or self.found is not None:
            return
        inputs, summing = self._watch(net)
        for layer in inputs:
            if getattr(layer, "nonfinite", None) is not None:
                self._note(INPUT, f"input layer '{layer.name}': {layer.nonfinite}")
                return
        for layer in summing:
            for key, value in layer.sums.items():
                if not math.isfinite(value):
                    kind = "loss layer" if layer.is_loss else "layer"
                    self._note(LOSS, f"{kind} '{layer.name}': {key} = {value}")
                    return

    def look_at_gradients(self, sync) -> None:
        """After the sums, before the update: the gradients this rank is about to apply."""
        if not self.enabled or self.found is not None:
            return
        param = sync.nonfinite_grad()
        if param is not None:
            self._note(GRADIENT, f"gradient of {self._name(param)} {self._gradient_holds(param)}")
            return
        overflowed = sync.overflowed() if hasattr(sync, "overflowed") else None
        if overflowed is not None:  # the servers updated the values: they say which one overflowed
            param, value = overflowed
            self._note(VALUES, f"{self._name(param)} holds {value} after the update on its server (its "
                               f"gradient was finite)")

    @staticmethod
    def _gradient_holds(param) -> str:
        """What the gradient holds: its first non-finite value, or, where this worker's part is finite
        (servers summed the group's parts), that the sum is not."""
        if first_nonfinite([param]) is param:
            return f"holds {first_bad_value(param.grad)}"
        return "holds a NaN or an infinity once summed on its server (this worker's part of it is finite)"

    def look_at_values(self, sync, when: str = "after the update (its gradient was finite)") -> None:
        """After the update, before a checkpoint: the values this rank updated (and checkpoints)."""
        if not self.enabled or self.found is not None:
            return
        param = first_nonfinite(sync.owned(), values=True)
        if param is not None:
            self._note(VALUES, f"{self._name(param)} holds {first_bad_value(param.data)} {when}")

    def check_initial(self, sync, runtime, step: int, workspace: str) -> None:
        """Before the first step (collective): the values training starts from."""
        self.look_at_values(sync, "before the first step (its initial value, or the checkpoint it was read from)")
        self.raise_if_found(runtime, step, "train", workspace)

    def _name(self, param) -> str:
        return f"param '{param.name}' (layer '{self.owners.get(param.name, '?')}')"

    def quiet(self):
        """While checking: numpy's overflow/invalid warnings off (the check names the first such value)."""
        if not self.enabled:
            return contextlib.nullcontext()
        return np.errstate(over="ignore", invalid="ignore", divide="ignore")

    # -------------------------------------------------------------- the verdict (collective)
    def raise_if_found(self, runtime, step: int, phase: str, workspace: str) -> None:
        """Every rank raises NonFiniteError if any rank found something, else none does.
        Collective: call it on every rank at the same point."""
        if not self.enabled or not runtime.any(self.found is not None):
            return
        findings = runtime.gather_object(self.found)
        if findings is None:  # not the root: the root's message is the one printed
            raise NonFiniteError(f"a non-finite value at step {step} ({phase}): see rank 0's message")
        found = [f for f in findings if f is not None]
        if not found:  # several worker groups stop together: the finding was another group's
            raise NonFiniteError(f"non-finite value at step {step} ({phase}) in another worker group: stopped "
                                 f"without checkpointing it; {advice(LOSS, self.switch)}")
        elsewhere = f" in worker group {runtime.group}" if runtime.group else ""
        first = min(found)
        on_rank = f" on rank {first.rank}" if runtime.size > 1 else ""
        err = NonFiniteError(f"non-finite value at step {step} ({phase}){on_rank}{elsewhere}: {first.text}: stopped "
                             f"without checkpointing it ({_kept(workspace)}); {advice(first.stage, self.switch)}")
        err.finding = GroupFinding(runtime.group, step, phase, on_rank, first.text, first.stage, self.switch)
        raise err


def _kept(workspace: str) -> str:
    """What a resume goes on from: the newest good checkpoint (a damaged newer file, which it skips, is not it)."""
    step = checkpoint.newest_sound_step(workspace)
    if step is not None:
        return f"the newest checkpoint is still {checkpoint.checkpoint_path(workspace, step)}"
    return "no good checkpoint: each written is damaged" if checkpoint.listed(workspace) else "no checkpoint was written"


def job_line(findings: list[GroupFinding], workspace: str) -> str:
    """The one line of a job of several worker groups that stopped on non-finite values, from every
    group's own finding (a group stopped by another's has none): the first (training before
    evaluation, then the earliest step, then the lowest group) with where, then the others'."""
    ordered = sorted(findings, key=lambda f: (f.phase != "train", f.step, f.group))
    first = ordered[0]
    others = "".join(f"; in worker group {f.group} too, at step {f.step} ({f.phase}){f.on_rank}: {f.text}"
                     for f in ordered[1:])
    return (f"non-finite value at step {first.step} ({first.phase}){first.on_rank} in worker group {first.group}: "
            f"{first.text}{others}: stopped without checkpointing it ({_kept(workspace)}); "
            f"{advice(first.stage, first.switch)}")
