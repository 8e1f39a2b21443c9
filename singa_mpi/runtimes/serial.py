"""The serial runtime: the whole net in one process, nothing to reduce."""
from __future__ import annotations

from typing import Callable

from singa_mpi.algorithms import frozen_params
from singa_mpi.config.load import JobConfig
from singa_mpi.cost.beside import Prediction, predict_plan
from singa_mpi.errors import SingaError
from singa_mpi.net import Net, build_serial_net
from singa_mpi.params import Param
from singa_mpi.planner import SHARED_MEMORY, partition
from singa_mpi.sync.base import FrozenParams, LocalSync, Synchronizer
from singa_mpi.tracing import Tracer


class SerialRuntime:
    """One process: the whole net, every param updated here."""

    rank, size, is_root = 0, 1, True
    group, groups, evaluates = 0, 1, True

    def __init__(self, cfg: JobConfig, seed: int, workspace: str, tracer: Tracer | None = None):
        self.cfg, self.seed, self.workspace = cfg, seed, workspace
        self.tracer = tracer if tracer is not None else Tracer(0)
        self.shared_params: dict[str, Param] = {}
        self._sync: Synchronizer | None = None

    def build_net(self, phase: str) -> Net:
        net = build_serial_net(self.cfg, phase, self.seed, self.workspace, self.shared_params, self.tracer)
        if phase == "train":
            frozen = frozen_params(self.cfg.proto) | {p.name for layer in net.layers
                                                      for p, spec in zip(layer.params, layer.param_specs)
                                                      if not spec.trained}
            self._sync = Synchronizer([LocalSync([p for p in net.params if p.name not in frozen]),
                                       FrozenParams([p for p in net.params if p.name in frozen])], self.tracer)
        return net

    def sync(self) -> Synchronizer:
        return self._sync

    def owned_params(self) -> list[Param]:
        return self._sync.owned() if self._sync is not None else []

    def contributes(self, param: Param) -> bool:
        return True

    def begin_step(self, step: int) -> None:
        self.tracer.step = step

    def begin_training(self, loaded, check_finite: bool) -> None:
        pass

    def server_state(self, final: bool) -> list[dict] | None:
        return None

    def group_steps(self, served: list[dict] | None) -> list[int] | None:
        return None

    def gather_groups(self, value) -> list | None:
        return None

    def vote_to_stop(self, flag: bool, signal: int | None = None, nonfinite: bool = False,
                     look: Callable[[], bool] | None = None) -> bool:
        return flag

    def allgather_object(self, value) -> list:
        return [value]

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def gather_object(self, value):
        return [value]

    def any(self, flag: bool) -> bool:
        return flag

    def barrier(self) -> None:
        pass

    def comm_seconds(self) -> float:
        return 0.0

    def report(self, steps: int, debug: bool = False) -> str | None:
        return None

    def pipeline(self) -> None:
        """One process runs whole batches: no stages to pipeline."""
        return None

    def predict_step(self) -> Prediction | str:
        """The cost model's training step of the job on one worker (or a line saying why there is none)."""
        try:
            return predict_plan(partition(self.cfg, 1, "train"), SHARED_MEMORY)
        except (SingaError, OSError) as err:  # the run itself succeeded: a line, not a failure
            return f"no prediction: {err}"

    def close(self) -> None:
        pass
