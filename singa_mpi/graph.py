"""The layer graph of one phase: nodes, edges and a stable topological order.

Pure data: no layers are instantiated here.  SINGA lists layers with their
``srclayers``; the execution order is a topological sort that keeps the file
order among independent layers (so runs are reproducible and readable).
"""
from __future__ import annotations

import dataclasses
import heapq

from singa_mpi.proto import job_pb2
from singa_mpi.registry import selected_name

# Undirected connections that SINGA writes as two directed edges (energy models):
# the edge from the second type back into the first is not an execution dependency.
BACK_EDGES = {("kRBMHid", "kRBMVis")}


@dataclasses.dataclass
class Node:
    """One layer of a phase's net, as written in the file."""

    index: int  # position in the file's neuralnet.layer list
    conf: job_pb2.LayerProto

    @property
    def name(self) -> str:
        return self.conf.name

    @property
    def type_name(self) -> str:
        return selected_name(self.conf)


class CycleError(Exception):
    def __init__(self, names: list[str]):
        super().__init__(" -> ".join(names))
        self.names = names


def is_back_edge(src: Node, dst: Node) -> bool:
    return (src.type_name, dst.type_name) in BACK_EDGES


def topological_order(nodes: list[Node]) -> list[Node]:
    """Nodes sorted so every source precedes its destinations; file order breaks ties.

    Raises CycleError naming the layers on a cycle.  Sources must all exist
    (the validator checks that first).
    """
    by_name = {n.name: n for n in nodes}
    position = {n.name: i for i, n in enumerate(nodes)}
    indegree = {n.name: 0 for n in nodes}
    dsts: dict[str, list[str]] = {n.name: [] for n in nodes}
    for node in nodes:
        for src_name in node.conf.srclayers:
            src = by_name[src_name]
            if is_back_edge(src, node):
                continue
            indegree[node.name] += 1
            dsts[src_name].append(node.name)
    ready = [position[n] for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        node = nodes[heapq.heappop(ready)]
        order.append(node)
        for dst in dsts[node.name]:
            indegree[dst] -= 1
            if indegree[dst] == 0:
                heapq.heappush(ready, position[dst])
    if len(order) < len(nodes):
        raise CycleError(_find_cycle(nodes, by_name, {n.name for n in order}))
    return order


def _find_cycle(nodes: list[Node], by_name: dict[str, Node], done: set[str]) -> list[str]:
    """A cycle among the nodes that could not be ordered, as a list of names."""
    remaining = [n for n in nodes if n.name not in done]
    start = remaining[0]
    path, seen = [start.name], {start.name: 0}
    current = start
    while True:
        nxt = next(by_name[s] for s in current.conf.srclayers
                   if s not in done and not is_back_edge(by_name[s], current))
        if nxt.name in seen:
            cycle = path[seen[nxt.name]:] + [nxt.name]
            return list(reversed(cycle))
        seen[nxt.name] = len(path)
        path.append(nxt.name)
        current = nxt
