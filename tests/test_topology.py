"""Roles from the cluster config (pure): SINGA's four frameworks, rank assignment, clear mismatches."""
import pytest

from singa_mpi.errors import ConfigError
from singa_mpi.proto import job_pb2
from singa_mpi.topology import SERVER, WORKER, check_supported, topology


def cluster(**fields) -> job_pb2.ClusterProto:
    return job_pb2.ClusterProto(**fields)


# the cluster confs of SINGA's frameworks.md, verbatim
SANDBLASTER = dict(nworker_groups=1, nserver_groups=1, nworkers_per_group=3, nservers_per_group=2,
                   server_worker_separate=True)
ALLREDUCE = dict(nworker_groups=1, nserver_groups=1, nworkers_per_group=3, nservers_per_group=3,
                 server_worker_separate=False)
DOWNPOUR = dict(nworker_groups=2, nserver_groups=1, nworkers_per_group=2, nservers_per_group=2,
                server_worker_separate=True)
HOGWILD = dict(nworker_groups=3, nserver_groups=3, nworkers_per_group=1, nservers_per_group=1,
               server_worker_separate=False)


def test_sandblaster_workers_first_then_separate_servers():
    topo = topology(5, cluster(**SANDBLASTER))
    assert topo.framework == "Sandblaster"
    assert topo.worker_groups == ((0, 1, 2),) and topo.server_groups == ((3, 4),)
    assert [(r.kind, r.group, r.index) for r in topo.roles] == [
        (WORKER, 0, 0), (WORKER, 0, 1), (WORKER, 0, 2), (SERVER, 0, 0), (SERVER, 0, 1)]
    check_supported(topo)


def test_allreduce_servers_live_in_the_workers_processes():
    topo = topology(3, cluster(**ALLREDUCE))
    assert topo.framework == "AllReduce"
    assert topo.worker_groups == ((0, 1, 2),) and topo.server_groups == ((0, 1, 2),)
    assert all(r.kind == WORKER and r.index == r.rank for r in topo.roles)
    check_supported(topo)


def test_downpour_two_worker_groups_one_server_group():
    topo = topology(6, cluster(**DOWNPOUR))
    assert topo.framework == "Downpour"
    assert topo.worker_groups == ((0, 1), (2, 3)) and topo.server_groups == ((4, 5),)
    assert [(r.group, r.index) for r in topo.roles[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    check_supported(topo)


def test_hogwild_a_server_group_in_every_worker_group():
    topo = topology(3, cluster(**HOGWILD))
    assert topo.framework == "Hogwild"
    assert topo.worker_groups == ((0,), (1,), (2,)) and topo.server_groups == ((0,), (1,), (2,))
    check_supported(topo)


@pytest.mark.parametrize("fields,world,expected", [
    (dict(nworker_groups=3, nserver_groups=2, server_worker_separate=True), 5,
     "nworker_groups: 3 cannot be divided among nserver_groups: 2"),
    (dict(nworker_groups=2, nserver_groups=2, server_worker_separate=True), 4,
     "nserver_groups: 2 with server_worker_separate: true (several groups of server ranks"),
    (dict(nworker_groups=2, nserver_groups=1, server_worker_separate=False), 2,
     "Downpour needs server ranks of its own"),
])
def test_shapes_no_runtime_builds_are_refused_saying_which_are(fields, world, expected):
    with pytest.raises(ConfigError, match="expected nserver_groups to divide|expected one of SINGA's frameworks") \
            as info:
        check_supported(topology(world, cluster(**fields), nworkers=1))
    assert expected in str(info.value)


def test_location_id_is_the_rank_inside_the_group():
    topo = topology(6, cluster(**DOWNPOUR))
    for group, ranks in enumerate(topo.worker_groups):
        for location, rank in enumerate(ranks):
            assert topo.role(rank).group == group and topo.role(rank).index == location


def test_workers_per_group_follow_the_world_when_the_job_leaves_it_open():
    topo = topology(4, cluster(), nworkers=4)
    assert topo.worker_groups == ((0, 1, 2, 3),) and topo.framework == "AllReduce"


@pytest.mark.parametrize("fields,world,needed", [(SANDBLASTER, 4, 5), (DOWNPOUR, 5, 6), (HOGWILD, 2, 3),
                                                 (ALLREDUCE, 4, 3)])
def test_a_world_that_does_not_fit_says_how_many_ranks_to_launch(fields, world, needed):
    with pytest.raises(ConfigError, match=f"expected mpiexec -n {needed}$"):  # every MPI's launcher
        topology(world, cluster(**fields))
    for launcher in ("mpirun", "srun"):  # the one that started the world, when known
        with pytest.raises(ConfigError, match=f"expected {launcher} -n {needed}$"):
            topology(world, cluster(**fields), launcher=launcher)


def test_describe_names_groups_and_ranks():
    text = topology(5, cluster(**SANDBLASTER)).describe()
    assert "worker group 0: ranks 0..2" in text and "server group 0: ranks 3..4" in text


def test_check_rejects_cluster_shapes_not_built_yet_with_file_and_line(tmp_path):
    """`singa-mpi check` and serial runs refuse them too (no world size needed)."""
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import parse_job
    import nets

    data = nets.make_data(str(tmp_path / "d.h5"), 16, (12,), 5)
    text = nets.mlp(data, 4, "data") + "cluster { nworker_groups: 2 }\n"
    with pytest.raises(ConfigError, match=r"^job.conf:\d+:\d+: nworker_groups: 2 with nserver_groups: 1 and "
                                          r"server_worker_separate: false is not supported"):
        validate(parse_job(text, "job.conf"))
