"""The cost model walks every rank's program (singa_mpi.cost.model): steps computed by hand from
made-up kernel times and rates (exact arithmetic), and what the order of the actions implies."""
import math

import pytest

import nets
from singa_mpi.algorithms import make_algorithm
from singa_mpi.algorithms.bptt import BackPropagationThroughTime
from singa_mpi.cost.kernels import KernelTime
from singa_mpi.cost.model import NotPriced, predict
from singa_mpi.cost.rates import Link, Rates
from singa_mpi.planner import ALLREDUCE, SHARED_MEMORY, plan, syncs
from cost_support import RowKernels

FREE = Link(0.0, 1e30)  # a link that costs nothing
ENDLESS_MEMORY = 1e30  # bytes/s: data copies and updates cost nothing


class ConstKernels:
    """Every sub-layer's forward takes ``forward`` seconds, its backward ``backward``; counts lookups."""

    def __init__(self, forward=1e-3, backward=2e-3, weights=0.0):
        self.forward, self.backward, self.weights, self.looked_up = forward, backward, weights, 0

    def of(self, the_plan, sub):
        self.looked_up += 1
        return KernelTime(self.forward, self.backward, self.weights if sub.params else 0.0)


def rates(p2p=FREE, allreduce=FREE, collective=FREE, memory=ENDLESS_MEMORY):
    return Rates(memory, p2p, allreduce, collective, "test")


@pytest.fixture
def data(tmp_path):
    return nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)


def two_rank_pipeline(data: str) -> str:
    """data, fc1 on rank 0; fc2, loss on rank 1: one bridge each way, and the labels' bridge."""
    whole = "partition_dim: -1"
    return nets.job_text([nets._data_layer(data, 16, (12,), f"{whole} location: 0"),
                          nets._ip("fc1", "data", 16, whole, loc="location: 0"),
                          nets._ip("fc2", "fc1", 5, whole, loc="location: 1"),
                          nets._loss("fc2", whole, "location: 1")])


def test_a_two_rank_bridge_step_by_hand(data):
    the_plan = plan(nets.job(two_rank_pipeline(data)), 2)
    F, B, latency, bandwidth = 1e-3, 2e-3, 1e-5, 1e8
    cost = predict(the_plan, SHARED_MEMORY, ConstKernels(F, B), rates(p2p=Link(latency, bandwidth)))
    activations = 16 * 16 * 4  # fc1's output, and its gradient back
    message = latency + activations / bandwidth
    # rank 0: fc1, Isend (its latency), the labels' Isend (another); rank 1 receives fc1's output at
    # F + message, computes fc2 and the loss (the labels arrived long before), their backward, and
    # sends the gradient back; rank 0 receives it and computes fc1's backward
    arrives = F + message
    rank1 = arrives + 2 * F + 2 * B + latency
    rank0 = arrives + 2 * F + 2 * B + message + B
    assert cost.per_rank == pytest.approx([rank0, rank1], rel=1e-12)
    assert cost.step == pytest.approx(3 * F + 3 * B + 2 * message, rel=1e-12)
    fc2 = next(layer for layer in cost.layers if layer.name == "fc2")
    assert fc2.comm == pytest.approx(2 * message, rel=1e-12)  # the bridge into fc2, both ways


def test_a_stage_s_weight_gradients_are_priced_where_its_queue_runs(data):
    """Two stages, two micro-batches, fc2's weight products 1 ms of its 2 ms backward.  1F1B runs a
    micro-batch's products after its backward has sent the gradient back (the first stage gets it 1 ms
    sooner than with the products inside the backward); ZB defers the last stage's past micro-batch
    1's backward, which the first stage waits for: one more millisecond off the step."""
    def step(schedule, weights):
        text = nets.pipelined(two_rank_pipeline(data), 2, schedule)
        return predict(plan(nets.job(text), 2), SHARED_MEMORY, ConstKernels(1e-3, 2e-3, weights), rates()).step

    inside = step("1f1b", 0.0)  # products priced in the backward: ZB and 1F1B alike
    assert step("zb", 0.0) == pytest.approx(inside, rel=1e-12)
    assert step("1f1b", 1e-3) == pytest.approx(inside - 1e-3, rel=1e-12)
    assert step("zb", 1e-3) == pytest.approx(inside - 2e-3, rel=1e-12)
    # unpipelined too, the last stage sends fc2's input gradient back before its products (at
    # finish-grads), which then run beside fc1's backward on the first stage
    unpiped = plan(nets.job(two_rank_pipeline(data)), 2)
    assert predict(unpiped, SHARED_MEMORY, ConstKernels(1e-3, 2e-3, 1e-3), rates()).step == pytest.approx(
        predict(unpiped, SHARED_MEMORY, ConstKernels(1e-3, 2e-3, 0.0), rates()).step - 1e-3, rel=1e-12)


def test_a_pipeline_takes_turns_where_a_batch_split_runs_side_by_side(data):
    """With free links a chain pipeline's step is the serial step (one rank computes at a time);
    the batch split computes each layer on both ranks at once."""
    serial = predict(plan(nets.job(nets.mlp(data, 16, "data")), 1), SHARED_MEMORY, RowKernels(), rates())
    pipeline = predict(plan(nets.job(nets.mlp(data, 16, "pipeline")), 2), SHARED_MEMORY, RowKernels(), rates())
    batch = predict(plan(nets.job(nets.mlp(data, 16, "data")), 2), SHARED_MEMORY, RowKernels(), rates())
    assert pipeline.step == pytest.approx(serial.step, rel=1e-12)
    assert pipeline.compute < serial.compute  # each rank computes its part only, but in turn
    assert batch.step == pytest.approx(serial.step / 2, rel=1e-12)


@pytest.mark.parametrize("ring,hidden", [(0.4e-3, True), (3e-3, False)])
def test_gradient_buckets_run_beside_backward_one_at_a_time(data, monkeypatch, ring, hidden):
    """One bucket per param (fc3's, then fc2's, then fc1's pair start as backward finishes each layer,
    2 layer backwards of B apart): a ring shorter than B hides all but fc1's pair; a longer one
    queues all six buckets behind fc3's, which started 4 B before backward ended."""
    monkeypatch.setattr(syncs, "BUCKET_BYTES", 4)  # every shard alone in its bucket
    the_plan = plan(nets.job(nets.mlp(data, 16, "data")), 2, method=ALLREDUCE)
    assert len(syncs.buckets(the_plan, ALLREDUCE)) == 6
    B = 1e-3
    allreduce = Link(ring / 2, 1e30)  # a 2-rank ring is 2 steps: each bucket takes ``ring``
    cost = predict(the_plan, ALLREDUCE, ConstKernels(1e-3, B), rates(allreduce=allreduce))
    assert cost.sync == pytest.approx(2 * ring if hidden else 6 * ring - 4 * B, rel=1e-9)


def test_the_batch_statistics_sums_are_on_every_rank_s_path(tmp_path):
    """A batch-split batch norm sums its statistics over the ranks forward and backward: two blocking
    Allreduces of 2 x 6 channels of float64 each step."""
    images = nets.make_data(str(tmp_path / "i.h5"), 64, (2, 8, 8), 5)
    the_plan = plan(nets.job(nets.convnet(images, 16, "data", bn=True)), 2)
    fast, slow = rates(allreduce=Link(1e-6, 1e9)), rates(allreduce=Link(1e-4, 1e6))
    ring = lambda r: r.ring_allreduce(2 * 6 * 8, 2)  # noqa: E731
    difference = (predict(the_plan, SHARED_MEMORY, RowKernels(), slow).step
                  - predict(the_plan, SHARED_MEMORY, RowKernels(), fast).step)
    assert difference == pytest.approx(2 * (ring(slow) - ring(fast)), rel=1e-9)


def test_a_cd_step_is_refused_before_any_kernel_is_timed_and_bptt_is_priced_as_bp(data):
    cd_job = nets.job(nets.rbm(data, 8))
    kernels = ConstKernels()
    with pytest.raises(NotPriced, match="forward and backward passes only.*positive"):
        predict(plan(cd_job, 2), SHARED_MEMORY, kernels, rates(), make_algorithm(cd_job.proto.train_one_batch))
    assert kernels.looked_up == 0
    mlp = plan(nets.job(nets.mlp(data, 16, "feature")), 2)
    slow = rates(p2p=Link(1e-5, 1e8), collective=Link(1e-5, 1e8))
    bp = predict(mlp, SHARED_MEMORY, RowKernels(), slow)
    assert predict(mlp, SHARED_MEMORY, RowKernels(), slow, BackPropagationThroughTime()) == bp
    assert math.isfinite(bp.step) and bp.step > 0


def test_buckets_are_served_first_come_first_served(data):
    """w_left is shared by a layer on rank 0 and one on rank 1: its bucket (ranks 0, 1) comes first in
    the planner's bucket order (buckets sort by their ranks), but backward finishes it last, after the
    scores' bucket (ranks 0-2) has started everywhere.  The scores' bucket runs first, so rank 2
    ends with it and ranks 0 and 1 one 2-rank ring later."""
    whole = "partition_dim: -1"
    text = nets.job_text([nets._data_layer(data, 12, (12,)), nets._ip("left", "data", 6, whole, loc="location: 0"),
                          nets._ip("right", "data", 6, whole, loc="location: 1", w="w_right", share="w_left"),
                          nets._ip("scores", "left", 5), nets._loss("scores"),
                          nets._ip("proj", "right", 5, whole, loc="location: 1"),
                          f'layer {{ name: "match" type: kEuclideanLoss srclayers: "proj" srclayers: "scores" '
                          f'{whole} location: 1 }}'])
    the_plan = plan(nets.job(text), 3, method=ALLREDUCE)
    assert [b.ranks for b in syncs.buckets(the_plan, ALLREDUCE)] == [(0, 1), (0, 1, 2)]
    step_latency = 1.25e-3  # a ring step: 4 per 3-rank ring, 2 per 2-rank ring
    cost = predict(the_plan, ALLREDUCE, ConstKernels(), rates(allreduce=Link(step_latency, 1e30)))
    assert cost.per_rank[0] == cost.per_rank[1] == cost.step
    assert cost.step - cost.per_rank[2] == pytest.approx(2 * step_latency, rel=1e-9)


def test_with_node_shared_memory_every_rank_ends_at_the_values_fence(data):
    """The update covers the rank's chunks of the shared params and the feature-split params it holds
    alone, then the fence: every rank's step ends there together."""
    the_plan = plan(nets.job(nets.mlp(data, 16, "hybrid")), 3)
    cost = predict(the_plan, SHARED_MEMORY, RowKernels(), rates(memory=1e9))
    assert len(set(cost.per_rank)) == 1 and cost.sync > 0
