"""The serial runtime: the whole net in one process, nothing to reduce."""
from __future__ import annotations

from typing import Callable

from singa_mpi.config.load import JobConfig
from singa_mpi.net import Net, build_serial_net
from singa_mpi.params import Param


class SerialRuntime:
    """One process: the whole net, nothing to reduce."""

    rank, size, is_root = 0, 1, True

    def __init__(self, cfg: JobConfig, seed: int, workspace: str):
        self.cfg, self.seed, self.workspace = cfg, seed, workspace
        self.shared_params: dict[str, Param] = {}

    def build_net(self, phase: str) -> Net:
        return build_serial_net(self.cfg, phase, self.seed, self.workspace, self.shared_params)

    def owned_params(self, net: Net) -> list[Param]:
        return net.params

    def gradient_hook(self, net: Net) -> Callable | None:
        return None

    def begin_step(self, step: int) -> None:
        pass

    def finish_update(self) -> None:
        pass

    def reduce_gradients(self, net: Net) -> None:
        pass

    def reduce_metrics(self, metrics: dict[str, float]) -> dict[str, float]:
        return metrics

    def comm_seconds(self) -> float:
        return 0.0

    def contributes(self, param: Param) -> bool:
        return True

    def gather_object(self, value):
        return [value]

    def any(self, flag: bool) -> bool:
        return flag

    def report(self, steps: int) -> str | None:
        return None
