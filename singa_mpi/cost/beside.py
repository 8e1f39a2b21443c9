"""The cost model's step beside a run's measured one (``singa-mpi train --profile``), and the
prediction both it and ``singa-mpi plan --cost`` print.

A run's profile (:mod:`singa_mpi.profiling`) holds every worker's ms per step per layer label: the
computing layers under their own names, the connection layers (bridges, slices, concats) under
theirs.  Each row of the comparison is one layer of the net: predicted forward and backward (the
slowest rank's part, as :mod:`.model` prices it) beside the slowest rank's measured ones; then the
connection layers together (predicted: the exchanges' time; measured: their spans, waits
included), and the whole step (measured: the slowest rank's train_one_batch + sync + update).
The measured numbers average every step of the run, the first ones (buffers allocated, caches
cold) included: on a short run they read high.
"""
from __future__ import annotations

import dataclasses

from singa_mpi import threads
from singa_mpi.cost.model import StepCost, predict
from singa_mpi.planner.plan import Plan

STEP_PHASES = ("train_one_batch", "sync", "update")


@dataclasses.dataclass
class Prediction:
    cost: StepCost
    plan: Plan
    method: str
    kernels_timed: int  # kernel shapes timed for this prediction (0: all from the cache)
    corunners: int
    cache: str

    def header(self) -> str:
        the_plan = self.plan
        timed = f", {self.kernels_timed} kernel shape(s) timed now" if self.kernels_timed else ""
        beside = f" beside {self.corunners} cop(ies) of themselves" if self.corunners else ""
        return (f"predicted step of {the_plan.nranks} worker(s), batch {the_plan.batch}, param sync {self.method} "
                f"(one BLAS thread per rank{timed}; kernels timed{beside}, cached in {self.cache})")


def predict_plan(the_plan: Plan, method: str, nodes: int = 1, recalibrate: bool = False,
                 algorithm=None) -> Prediction:
    """The predicted step of ``the_plan`` on this machine (``algorithm``: the job's; None: BP): kernels
    timed here (or read from the cache) beside a copy per other rank of the node, with the cached
    communicator rates."""
    from singa_mpi.cost import rates
    from singa_mpi.cost.kernels import KernelTimes, corunners_for

    if nodes > 1:
        method = "allreduce"  # node-shared memory needs one node: the runtime then takes buckets
    with threads.limit_blas(1):  # as a launched rank runs: one BLAS thread each (bench_env, threads.py)
        kernels = KernelTimes(recalibrate=recalibrate, corunners=corunners_for(-(-the_plan.nranks // nodes)))
        try:
            cost = predict(the_plan, method, kernels, rates.network(the_plan.nranks, nodes), algorithm)
        finally:
            kernels.save()
    return Prediction(cost, the_plan, method, kernels.measured, kernels.corunners, str(kernels.path))


def _measured(profile: dict, layers: list[str]) -> tuple[dict[str, dict[str, float]], float, float]:
    """({layer: {"forward": s, "backward": s}} the slowest rank's, connection layers' seconds on the
    slowest rank, the slowest rank's step seconds), per step."""
    per_layer: dict[str, dict[str, float]] = {name: {} for name in layers}
    connections = step = 0.0
    for rows in profile["ranks"]:
        mine = 0.0
        phases = 0.0
        for row in rows:
            cat, name, seconds = row["cat"], row["name"], row["seconds"]
            if cat == "step":
                phases += seconds if name in STEP_PHASES else 0.0
            elif cat in ("forward", "backward"):
                if name in per_layer:
                    cell = per_layer[name]
                    cell[cat] = max(cell.get(cat, 0.0), seconds)
                else:
                    mine += seconds
        connections, step = max(connections, mine), max(step, phases)
    return per_layer, connections, step


def beside_lines(profile: dict, prediction: Prediction) -> list[str]:
    """The comparison table, ms per step."""
    cost = prediction.cost
    names = [layer.name for layer in cost.layers]
    measured, connections, step = _measured(profile, names)
    width = max([len("connection layers")] + [len(name) for name in names])
    lines = [f"predicted beside measured, ms per step: {prediction.header()}; communicator rates: "
             f"{cost.rates_source}",
             f"  {'layer':<{width}} {'forward':>9} {'measured':>9} {'backward':>9} {'measured':>9}"]

    def cell(value: float | None) -> str:
        return f"{1e3 * value:>9.3f}" if value is not None else f"{'-':>9}"

    for layer in cost.layers:
        seen = measured[layer.name]
        lines.append(f"  {layer.name:<{width}} {cell(layer.forward)} {cell(seen.get('forward'))} "
                     f"{cell(layer.backward)} {cell(seen.get('backward'))}")
    exchanges = sum(layer.comm for layer in cost.layers)
    lines.append(f"  {'connection layers':<{width}} {cell(exchanges)} {cell(connections)}   (predicted: the "
                 f"exchanges; measured: their forward and backward, waits included)")
    ratio = f"; predicted/measured {cost.step / step:.2f}" if step > 0 else ""
    lines.append(f"  step: predicted {1e3 * cost.step:.2f} ms (param sync and update after backward "
                 f"{1e3 * cost.sync:.2f}), measured {1e3 * step:.2f} ms over {profile['steps']} steps "
                 f"(the slowest worker's train_one_batch + sync + update){ratio}")
    return lines


def cost_lines(the_plan, method: str, recalibrate: bool, nodes: int, algorithm=None) -> list[str]:
    """``plan --cost``: the predicted ms per layer and per step (kernels timed here, once per machine)."""
    prediction = predict_plan(the_plan, method, nodes, recalibrate, algorithm)
    cost = prediction.cost
    return ([prediction.header(), f"communicator rates: {cost.rates_source}"] + cost.table()
            + [f"predicted {the_plan.batch / cost.step:,.0f} samples/s"])
