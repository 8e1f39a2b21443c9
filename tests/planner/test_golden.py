"""Golden plans for the four partitioning schemes of seed 001 on seed 002's small CNN.

Seed 002's net: data (with its MNIST parser and label layers, here one
kRecordInput that yields images and labels), conv1, relu1, pool1, fc1, loss;
batch 8 of 28x28 images.  SINGA drew the inserted helper layers as
Slice/Concate/Split plus BridgeSrc/BridgeDst pairs per pair of workers; here a
connection that spans all workers is one collective layer per worker (its
name keeps SINGA's `slice(...)`/`concate(split(...))` form) and only a true
two-worker hand-over is a bridge pair: the documented equivalent.
"""
import pytest

import nets
from singa_mpi.errors import ConfigError
from singa_mpi.planner import plan
from singa_mpi.planner.schedule import schedules


def cnn(pdims: dict[str, str]) -> str:
    p = {name: pdims.get(name, "") for name in ("data", "conv1", "relu1", "pool1", "fc1", "loss")}
    layers = [
        f'layer {{ name: "data" type: kRecordInput {p["data"]} store_conf {{ backend: "hdf5" path: "x.h5" '
        f'batchsize: 8 shape: 1 shape: 28 shape: 28 }} }}',
        f'layer {{ name: "conv1" type: kConvolution srclayers: "data" {p["conv1"]} '
        f'convolution_conf {{ num_filters: 8 kernel: 2 }} param {{ name: "w1" init {{ type: kGaussian }} }} '
        f'param {{ name: "b1" init {{ type: kConstant value: 0 }} }} }}',
        f'layer {{ name: "relu1" type: kReLU srclayers: "conv1" {p["relu1"]} }}',
        f'layer {{ name: "pool1" type: kPooling srclayers: "relu1" {p["pool1"]} pooling_conf {{ kernel: 3 stride: 2 }} }}',
        f'layer {{ name: "fc1" type: kInnerProduct srclayers: "pool1" {p["fc1"]} '
        f'innerproduct_conf {{ num_output: 10 }} param {{ name: "w2" init {{ type: kGaussian }} }} '
        f'param {{ name: "b2" init {{ type: kConstant value: 0 }} }} }}',
        f'layer {{ name: "loss" type: kSoftmaxLoss srclayers: "fc1" srclayers: "data" {p["loss"]} }}',
    ]
    return nets.job_text(layers)


def inserted(the_plan):
    return [(s.name, s.type, s.rank, s.exchange.forward_op) for s in the_plan.sublayers if s.origin is None]


def test_scheme1_batch_partition_3_workers():
    """Data layer whole on worker 0, every other layer split on the batch (8 = 3 + 3 + 2 rows)."""
    the_plan = plan(nets.job(cnn({"data": "partition_dim: -1"})), 3)
    assert inserted(the_plan) == [
        ("slice(data)@0", "kSlice", 0, "Scatterv"), ("slice(data)@1", "kSlice", 1, "Scatterv"),
        ("slice(data)@2", "kSlice", 2, "Scatterv"),
        ("slice(data).label@0", "kSlice", 0, "Scatterv"), ("slice(data).label@1", "kSlice", 1, "Scatterv"),
        ("slice(data).label@2", "kSlice", 2, "Scatterv"),
    ]
    assert [s.region.rows for s in the_plan.sublayers if s.origin == "conv1"] == [(0, 3), (3, 6), (6, 8)]
    assert [s.out_shape for s in the_plan.sublayers if s.origin == "conv1"] == [(3, 8, 27, 27), (3, 8, 27, 27),
                                                                              (2, 8, 27, 27)]
    # replicated params: one allreduce group per param over all three workers
    assert {(p.name, p.ranks) for p in the_plan.param_syncs} == {(n, (0, 1, 2)) for n in ("w1", "b1", "w2", "b2")}
    # the slice needs no gradient: nothing below it has parameters
    assert all(op.direction != "backward" for ops in schedules(the_plan).values() for op in ops)


def test_scheme2_feature_partition_2_workers():
    """conv1..fc1 split on features: conv1@0 computes filters 0-3, conv1@1 filters 4-7."""
    one = "partition_dim: 1"
    the_plan = plan(nets.job(cnn({"data": "partition_dim: -1", "conv1": one, "relu1": one, "pool1": one,
                                  "fc1": one, "loss": "partition_dim: -1"})), 2)
    assert inserted(the_plan) == [
        ("split(data)@0", "kSplit", 0, "Bcast"), ("split(data)@1", "kSplit", 1, "Bcast"),
        ("concate(split(pool1))@0", "kConcate", 0, "Allgatherv"),
        ("concate(split(pool1))@1", "kConcate", 1, "Allgatherv"),
        ("concate(fc1)@0", "kConcate", 0, "Gatherv"), ("concate(fc1)@1", "kConcate", 1, "Gatherv"),
    ]
    conv = [s for s in the_plan.sublayers if s.origin == "conv1"]
    assert [s.out_shape for s in conv] == [(8, 4, 27, 27), (8, 4, 27, 27)]
    assert [s.params[0].offsets for s in conv] == [((0, 4), (0, 4)), ((4, 8), (0, 4))]
    assert the_plan.param_syncs == []  # sharded params: nothing to average
    # relu1 and pool1 follow conv1 on the same feature slice without any connection
    assert the_plan.sublayer("relu1@1").srcs == ["conv1@1"]


def test_scheme3_location_2_workers():
    """data, conv1, relu1 on worker 0; pool1, fc1, loss on worker 1: two bridge pairs."""
    none = "partition_dim: -1"
    the_plan = plan(nets.job(cnn({"data": none, "conv1": none, "relu1": none,
                                  "pool1": f"{none} location: 1", "fc1": f"{none} location: 1",
                                  "loss": f"{none} location: 1"})), 2)
    assert inserted(the_plan) == [
        ("bridge_src(relu1->pool1)", "kBridgeSrc", 0, "Send"), ("bridge_dst(relu1->pool1)", "kBridgeDst", 1, "Send"),
        ("bridge_src(data->loss.label)", "kBridgeSrc", 0, "Send"),
        ("bridge_dst(data->loss.label)", "kBridgeDst", 1, "Send"),
    ]
    ops = schedules(the_plan)
    assert [(o.op, o.peer, o.direction) for o in ops[0]] == [
        ("Isend", 1, "forward"), ("Isend", 1, "forward"), ("Irecv", 1, "backward")]
    assert [(o.op, o.peer, o.direction) for o in ops[1]] == [
        ("Recv", 0, "forward"), ("Recv", 0, "forward"), ("Isend", 0, "backward")]


def test_scheme4_hybrid_2_workers():
    """Convolution part on the batch, fc1 on features (Krizhevsky's 'one weird trick')."""
    the_plan = plan(nets.job(cnn({"fc1": "partition_dim: 1"})), 2)
    assert inserted(the_plan) == [
        ("concate(split(pool1))@0", "kConcate", 0, "Allgatherv"),
        ("concate(split(pool1))@1", "kConcate", 1, "Allgatherv"),
        ("concate(slice(fc1))@0", "kConcate", 0, "Alltoallv"), ("concate(slice(fc1))@1", "kConcate", 1, "Alltoallv"),
    ]
    fc1 = [s for s in the_plan.sublayers if s.origin == "fc1"]
    assert [s.params[0].offsets for s in fc1] == [((0, 5), (0, 1352)), ((5, 10), (0, 1352))]
    assert {p.name for p in the_plan.param_syncs} == {"w1", "b1"}


def test_rejects_loss_on_features():
    with pytest.raises(ConfigError, match=r"layer 'loss'.*partition_dim = 1.*a loss needs every class score"):
        plan(nets.job(cnn({"loss": "partition_dim: 1"})), 2)


def test_rejects_idle_worker():
    none = "partition_dim: -1"
    text = cnn({k: none for k in ("data", "conv1", "relu1", "pool1", "fc1", "loss")})
    with pytest.raises(ConfigError, match=r"^<test>:\d+:\d+: worker\(s\) 1, 2 of 3 would run no layer"):
        plan(nets.job(text), 3)  # at the net's line: no one layer is at fault


def test_idle_workers_of_a_large_rank_count_are_named_as_runs():
    """`plan -n 1024` of a net placed on worker 0 named all 1,023 idle workers, a line of 5 KB."""
    none = "partition_dim: -1"
    text = cnn({k: none for k in ("data", "conv1", "relu1", "pool1", "fc1", "loss")})
    with pytest.raises(ConfigError, match=r"^<test>:\d+:\d+: worker\(s\) 1\.\.1023 of 1024 would run no layer: "):
        plan(nets.job(text), 1024)


def test_rejects_location_beyond_workers():
    with pytest.raises(ConfigError, match=r"layer 'fc1'.*location = 5: expected a worker id below"):
        plan(nets.job(cnn({"fc1": "partition_dim: -1 location: 5"})), 2)


@pytest.mark.parametrize("pdim", [0, 1])
def test_rejects_location_beyond_workers_on_a_split_layer_too(pdim):
    """A split layer's location went unused, so `location: 5` on 2 workers trained on silently."""
    with pytest.raises(ConfigError, match=rf"^<test>:\d+:\d+: layer 'fc1' \(#\d+, kInnerProduct\): location = 5: "
                                          rf"expected a worker id below the number of workers \(2\); this layer is "
                                          rf"split over them \(partition_dim {pdim}\), so leave it out$"):
        plan(nets.job(cnn({"fc1": f"partition_dim: {pdim} location: 5"})), 2)
    plan(nets.job(cnn({"fc1": f"partition_dim: {pdim} location: 1"})), 2)  # unused, and a worker there is


def test_rejects_batch_smaller_than_workers():
    with pytest.raises(ConfigError, match=r"a batch of at least 9 rows"):
        plan(nets.job(cnn({})), 9)


def test_one_worker_runs_the_whole_net_wherever_the_job_places_layers():
    """`plan -n 1` and `check -n 1` of conf/mnist_mlp_pipeline.conf refused "location = 1: expected a
    worker id below the number of workers (1)", while `train` on one process (and mpiexec -n 1) ran the
    whole net; one worker now plans every layer there, as its comment always said."""
    cfg = nets.job(cnn({"fc1": "partition_dim: -1 location: 5", "loss": "partition_dim: -1 location: 1"}))
    one = plan(cfg, 1)
    assert {sub.rank for sub in one.sublayers} == {0} and not [s for s in one.sublayers if s.exchange]
    with pytest.raises(ConfigError, match=r"layer 'fc1'.*location = 5: expected a worker id below the number of "
                                          r"workers \(4\)"):
        plan(cfg, 4)
