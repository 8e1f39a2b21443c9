"""A rank's part of the step as the program builders see it: one :class:`Unit` per sub-layer.

Built from a plan (pure: any rank of any world, in one process) or from a net already built
(the serial runtime, a plugin algorithm's passes); both give the same units in the same order,
which is the rank's execution order.
"""
from __future__ import annotations

import dataclasses

from singa_mpi.layers.base import layer_class_of

ShardKey = tuple[str, tuple[tuple[int, int], ...]]


@dataclasses.dataclass(frozen=True)
class Unit:
    """One sub-layer of a rank: what decides which actions it takes in each pass."""

    name: str
    needs_grad: bool  # something at or below it has params (decided globally: every rank agrees)
    params: tuple[ShardKey, ...] = ()  # its param shards (name, offsets), in the layer's order
    is_loss: bool = False
    energy_role: str = ""  # an RBM's "visible" or "hidden" layer
    pair: tuple[str, str] | None = None  # (visible, hidden) of its RBM pair, or the edge of an exchange
    sub: object | None = None  # the plan's SubLayer (None for a serial net's layer)

    @property
    def exchange(self):
        return self.sub.exchange if self.sub is not None else None

    @property
    def row_group(self) -> tuple[int, ...]:
        return self.sub.row_group if self.sub is not None else ()


def pair_of(conf, energy_role: str) -> tuple[str, str] | None:
    """(visible, hidden) layer names of an RBM layer's pair, from either half's sources."""
    if energy_role == "visible":
        return conf.name, conf.srclayers[1]
    if energy_role == "hidden":
        return conf.srclayers[0], conf.name
    return None


def units_of_plan(plan, rank: int) -> list[Unit]:
    """``rank``'s units in execution order (pure)."""
    units = []
    for sub in plan.on_rank(rank):
        params = tuple((shard.name, shard.offsets) for shard in sub.params)
        if sub.origin is None:
            ex = sub.exchange
            units.append(Unit(sub.name, sub.needs_grad, params, pair=(ex.src_layer, ex.dst_layer), sub=sub))
            continue
        conf = plan.origins[sub.origin].conf
        cls = layer_class_of(conf)
        units.append(Unit(sub.name, sub.needs_grad, params, cls.is_loss, cls.energy_role,
                          pair_of(conf, cls.energy_role), sub))
    return units


def units_of_net(net) -> list[Unit]:
    """The units of a net already built, under the names its program uses (:attr:`Net.names`)."""
    units = []
    for name, wire in zip(net.names, net.wires):
        layer = wire.layer
        sub = getattr(layer, "sub", None)  # a connection layer carries its plan entry
        params = tuple((p.name, tuple(p.shard) if p.shard else ()) for p in layer.params)
        if sub is not None:
            units.append(Unit(name, bool(wire.needs_grad), params, pair=layer.edge(), sub=sub))
            continue
        units.append(Unit(name, bool(wire.needs_grad), params, layer.is_loss, layer.energy_role,
                          pair_of(layer.conf, layer.energy_role)))
    return units
