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
from collections.abc import Callable

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
    """SINGA's name for a cluster shape (frameworks.md), or a description of a shape it did not name."""
    if ngroups == 1 and nserver_groups == 1:
        return "Sandblaster" if separate else "AllReduce"
    if ngroups > 1 and nserver_groups == 1:
        return "Downpour"
    if ngroups > 1 and not separate:
        return "Hogwild"
    return f"{ngroups} worker group(s) and {nserver_groups} server group(s)"  # a shape SINGA gave no name


def topology(world_size: int, cluster, nworkers: int | None = None, where: str = "cluster",
             launcher: str = "mpiexec") -> Topology:
    """Roles of every rank for ``cluster`` (a ClusterProto).

    ``nworkers``: workers per group when the job leaves ``nworkers_per_group``
    unset (the launcher passes what the world size implies).  ConfigError (``where``: the cluster's
    FILE:LINE:COL), saying how many ranks to launch (``launcher``: the command that started this world,
    :func:`singa_mpi.launcher.start.launcher_name`; mpiexec is every MPI's), if the world does not fit.
    """
    ngroups, per_group, nserver_groups, per_server_group, separate = _fit(world_size, cluster, nworkers, where,
                                                                          launcher)
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


def _fit(world_size: int, cluster, nworkers: int | None, where: str,
         launcher: str = "mpiexec", checked: bool = False) -> tuple[int, int, int, int, bool]:
    """(worker groups, workers per group, server groups, servers per group, servers separate) of
    ``cluster`` on ``world_size`` ranks; ConfigError saying how many ranks to launch (with ``launcher``)
    if they do not fit (``checked``: the count is `check -n`'s, which launches nothing)."""
    ngroups = max(1, cluster.nworker_groups)
    per_group = cluster.nworkers_per_group if cluster.HasField("nworkers_per_group") else None
    nserver_groups = max(1, cluster.nserver_groups)
    separate = bool(cluster.server_worker_separate)
    per_server_group = max(1, cluster.nservers_per_group)
    server_ranks = nserver_groups * per_server_group
    if per_group is None:
        per_group = nworkers if nworkers is not None else (world_size - (server_ranks if separate else 0)) // ngroups
    if per_group < 1:
        raise ConfigError(f"{where}: {world_size} rank(s) leave no worker per group: expected at least "
                          f"{ngroups + (server_ranks if separate else 0)} ranks")
    # SINGA's process count (cluster.cc): separate servers add processes, co-located ones share them
    needed = ngroups * per_group + server_ranks if separate else max(ngroups * per_group, server_ranks)
    if needed != world_size:
        parts = [f"{ngroups} worker group(s) x {per_group} worker(s)"]
        if separate:
            parts.append(f"{nserver_groups} server group(s) x {per_server_group} server(s)")
        elif server_ranks > ngroups * per_group:  # the servers, not the workers, set the count
            parts[0] += f" with {server_ranks} co-located server(s) (cluster.nservers_per_group)"
        if checked:
            raise ConfigError(f"{where}: {' + '.join(parts)} need {needed} ranks, checked for {world_size} (check -n "
                              f"{world_size}): expected check -n {needed} (and {launcher} -n {needed} to train it)")
        raise ConfigError(f"{where}: {' + '.join(parts)} need {needed} ranks, launched with {world_size}: "
                          f"expected {launcher} -n {needed}")
    return ngroups, per_group, nserver_groups, per_server_group, separate


COUNT_FIELDS = ("nworker_groups", "nserver_groups", "nworkers_per_group", "nservers_per_group")


def check_cluster_supported(cluster, where: str = "cluster", field_where: Callable[[str], str] | None = None) -> None:
    """``check`` (and every rank before a launch, in validation): the job's cluster alone, no world size
    known.  Counts below 1 are errors; the shape is judged by the same rule as :func:`check_supported`,
    the check ``train`` makes on the launched topology, so both refuse the same shapes, in the same words.
    ``field_where(name)``: where ``cluster.<name>`` is written (default: ``where``)."""
    for field in COUNT_FIELDS:
        value = getattr(cluster, field)
        if cluster.HasField(field) and value < 1:
            raise ConfigError(f"{field_where(field) if field_where else where}: cluster.{field} = {value}: "
                              f"expected at least 1")
    for field, value in (("sync_freq", cluster.sync_freq), ("max_staleness", cluster.max_staleness + 1)):
        if cluster.HasField(field) and value < 1:
            raise ConfigError(f"{field_where(field) if field_where else where}: cluster.{field} = "
                              f"{getattr(cluster, field)}: expected at least {1 if field == 'sync_freq' else 0}")
    _refuse_unsupported(cluster.nworker_groups, cluster.nserver_groups, bool(cluster.server_worker_separate),
                        where)


def check_launch(cluster, nranks: int, where: str = "cluster", checked: bool = True, launcher: str = "mpiexec") -> int:
    """``check -n N``: the refusals of a launch of ``cluster`` on N ranks, as ``train`` makes them (one
    worker group follows the launched count, as ``--workers`` does); no roles are built.  Returns the
    workers per group.  ``checked``: the refusal speaks of `check -n N` (else of a launch on N ranks
    with ``launcher``)."""
    check_cluster_supported(cluster, where)
    if cluster.nworker_groups == 1 and not cluster.server_worker_separate:
        copy = type(cluster)()
        copy.CopyFrom(cluster)
        copy.nworkers_per_group = nranks
        cluster = copy
    return _fit(nranks, cluster, nranks, where, launcher, checked=checked)[1]


def ranks_needed(cluster) -> int:
    """How many ranks a launch of ``cluster`` takes (its nworkers_per_group, default 1, per group)."""
    groups, per_group = max(1, cluster.nworker_groups), max(1, cluster.nworkers_per_group)
    servers = max(1, cluster.nserver_groups) * max(1, cluster.nservers_per_group)
    return groups * per_group + servers if cluster.server_worker_separate else max(groups * per_group, servers)


def check_supported(topo: Topology, where: str = "cluster") -> None:
    """The launched topology is one the runtimes build (see :func:`_refuse_unsupported`)."""
    _refuse_unsupported(len(topo.worker_groups), len(topo.server_groups), topo.servers_separate, where)


SUPPORTED = ("expected one of SINGA's frameworks: AllReduce (nworker_groups: 1, server_worker_separate: false), "
             "Sandblaster (nworker_groups: 1, nserver_groups: 1, server_worker_separate: true), Downpour "
             "(nworker_groups > 1, nserver_groups: 1, server_worker_separate: true) or Hogwild (nserver_groups "
             "equal to nworker_groups, server_worker_separate: false)")


def _refuse_unsupported(ngroups: int, nserver_groups: int, separate: bool, where: str) -> None:
    """ConfigError for a cluster shape the runtimes do not build: ``check`` (from the job) and
    ``train`` (from the launched topology) both end here, so both refuse the same shapes."""
    if ngroups % nserver_groups:
        raise ConfigError(f"{where}: nworker_groups: {ngroups} cannot be divided among nserver_groups: "
                          f"{nserver_groups} (SINGA gives each server group nworker_groups / nserver_groups "
                          f"worker groups): expected nserver_groups to divide nworker_groups")
    if separate and nserver_groups > 1:
        raise ConfigError(f"{where}: nserver_groups: {nserver_groups} with server_worker_separate: true (several "
                          f"groups of server ranks that synchronise with each other) is not supported: {SUPPORTED}")
    if not separate and ngroups > 1 and nserver_groups != ngroups:
        raise ConfigError(f"{where}: nworker_groups: {ngroups} with nserver_groups: {nserver_groups} and "
                          f"server_worker_separate: false is not supported (co-located servers are each group's "
                          f"own; Downpour needs server ranks of its own): {SUPPORTED}")
