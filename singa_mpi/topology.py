"""Who is who in an MPI world: worker groups, server groups, location IDs.  Pure, no MPI.

SINGA 0.x describes a cluster with ``nworker_groups`` groups of
``nworkers_per_group`` workers, ``nserver_groups`` groups of
``nservers_per_group`` servers, and ``server_worker_separate`` (servers in
processes of their own, or co-located with the workers).  Its four frameworks
are shapes of that description (SINGA's frameworks.md):

=============  ================  ===============  =======================
framework      worker groups     server groups    servers separate
=============  ================  ===============  =======================
Sandblaster    1                 1                yes
AllReduce      1                 1                no (co-located)
Downpour       several           1                yes
Hogwild        several           one per group    no (co-located)
=============  ================  ===============  =======================

Ranks are assigned as SINGA assigns processes: the workers of group 0
(location IDs 0..k-1), then those of group 1, ...; then, when servers are
separate, the servers of server group 0, 1, ...  Inside a group a worker's rank
in the group communicator equals its location ID, so every partitioning scheme
of the net works inside every group.
"""
from __future__ import annotations

import dataclasses

from singa_mpi.errors import ConfigError

WORKER, SERVER = "worker", "server"


@dataclasses.dataclass(frozen=True)
class Role:
    """One rank's role: a worker (``index`` = its location ID in its group) or a server."""

    rank: int
    kind: str  # WORKER or SERVER
    group: int
    index: int


@dataclasses.dataclass(frozen=True)
class Topology:
    world_size: int
    roles: tuple[Role, ...]  # indexed by world rank
    worker_groups: tuple[tuple[int, ...], ...]  # world ranks of each worker group, by location ID
    server_groups: tuple[tuple[int, ...], ...]  # world ranks of each server group
    servers_separate: bool
    framework: str

    def role(self, rank: int) -> Role:
        return self.roles[rank]

    @property
    def workers_per_group(self) -> int:
        return len(self.worker_groups[0])

    def describe(self) -> str:
        """One line per group, for `plan` and error messages."""
        lines = [f"{self.framework}: {self.world_size} rank(s)"]
        for g, ranks in enumerate(self.worker_groups):
            lines.append(f"  worker group {g}: ranks {_span(ranks)} (location IDs 0..{len(ranks) - 1})")
        for g, ranks in enumerate(self.server_groups):
            where = "" if self.servers_separate else " (co-located with workers)"
            lines.append(f"  server group {g}: ranks {_span(ranks)}{where}")
        return "\n".join(lines)


def _span(ranks: tuple[int, ...]) -> str:
    return f"{ranks[0]}..{ranks[-1]}" if len(ranks) > 1 else str(ranks[0])


def framework_name(ngroups: int, nserver_groups: int, separate: bool) -> str:
    if ngroups == 1:
        return "Sandblaster" if separate else "AllReduce"
    if nserver_groups == 1:
        return "Downpour"
    return "Hogwild" if not separate else "Downpour-like (several server groups)"


def topology(world_size: int, cluster, nworkers: int | None = None) -> Topology:
    """Roles of every rank for ``cluster`` (a ClusterProto).

    ``nworkers``: workers per group when the job leaves ``nworkers_per_group``
    unset (the launcher passes what the world size implies).  ConfigError,
    saying how many ranks to launch, if the world does not fit the cluster.
    """
    ngroups = max(1, cluster.nworker_groups)
    per_group = cluster.nworkers_per_group if cluster.HasField("nworkers_per_group") else None
    nserver_groups = max(1, cluster.nserver_groups)
    separate = bool(cluster.server_worker_separate)
    per_server_group = max(1, cluster.nservers_per_group)
    server_ranks = nserver_groups * per_server_group
    if per_group is None:
        per_group = nworkers if nworkers is not None else (world_size - (server_ranks if separate else 0)) // ngroups
    if per_group < 1:
        raise ConfigError(f"cluster: {world_size} rank(s) leave no worker per group: expected at least "
                          f"{ngroups + (server_ranks if separate else 0)} ranks")
    # SINGA's process count (cluster.cc): separate servers add processes, co-located ones share them
    needed = ngroups * per_group + server_ranks if separate else max(ngroups * per_group, server_ranks)
    if needed != world_size:
        parts = [f"{ngroups} worker group(s) x {per_group} worker(s)"]
        if separate:
            parts.append(f"{nserver_groups} server group(s) x {per_server_group} server(s)")
        raise ConfigError(f"cluster: {' + '.join(parts)} need {needed} ranks, launched with {world_size}: "
                          f"expected mpirun -n {needed}")
    roles: list[Role] = []
    worker_groups = []
    for g in range(ngroups):
        ranks = tuple(range(g * per_group, (g + 1) * per_group))
        worker_groups.append(ranks)
        roles += [Role(rank, WORKER, g, i) for i, rank in enumerate(ranks)]
    # servers: rank g * nservers_per_group + s, after the workers when separate (cluster.cc);
    # co-located servers share the workers' processes and take no role of their own
    first = ngroups * per_group if separate else 0
    server_groups = []
    for g in range(nserver_groups):
        ranks = tuple(range(first + g * per_server_group, first + (g + 1) * per_server_group))
        server_groups.append(ranks)
        for index, rank in enumerate(ranks):
            if separate or rank >= ngroups * per_group:  # a rank of its own (co-located: beyond the workers)
                roles.append(Role(rank, SERVER, g, index))
    roles.sort(key=lambda role: role.rank)
    return Topology(world_size, tuple(roles), tuple(worker_groups), tuple(server_groups), separate,
                    framework_name(ngroups, nserver_groups, separate))


def check_cluster_supported(cluster, where: str = "cluster") -> None:
    """The same check from the job alone (``check`` and serial runs, where no world size is known)."""
    ngroups, nserver_groups = max(1, cluster.nworker_groups), max(1, cluster.nserver_groups)
    if ngroups > 1 or nserver_groups > 1 or cluster.server_worker_separate:
        framework = framework_name(ngroups, nserver_groups, bool(cluster.server_worker_separate))
        raise ConfigError(
            f"{where}: the {framework} framework (worker groups and server ranks) is not supported yet: "
            f"expected nworker_groups: 1, nserver_groups: 1, server_worker_separate: false")


def check_supported(topo: Topology, where: str = "cluster") -> None:
    """Today's runtimes: one worker group whose parameters sync among the workers (AllReduce)."""
    if len(topo.worker_groups) > 1 or topo.servers_separate or len(topo.server_groups) > 1:
        raise ConfigError(
            f"{where}: the {topo.framework} framework (worker groups and server ranks) is not supported yet: "
            f"expected nworker_groups: 1, nserver_groups: 1, server_worker_separate: false")
