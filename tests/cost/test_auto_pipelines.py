"""plan --auto prices pipelines (every layer whole, stages of about equal predicted time for GPipe, 1F1B
and ZB, runs of layers dealt round robin for interleaved, over 2, 4 and 8 micro-batches) beside the
partitionings, and chooses one only where it is predicted
clearly faster; the memory it predicts counts what each schedule holds."""
import dataclasses

import pytest
from google.protobuf import text_format

import nets
from cost_support import RowKernels
from singa_mpi.config.load import parse_job
from singa_mpi.cost.auto import Search, choose, memory_by_rank, plan_memory, with_choice
from singa_mpi.cost.rates import Link, Rates
from singa_mpi.errors import ConfigError
from singa_mpi.planner import ALLREDUCE, partition

SLOW, FAST = Link(1e-3, 1e5), Link(1e-9, 1e12)


def _mlp(tmp_path, scheme="data", batch=32):
    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    return nets.job(nets.mlp(data, batch, scheme, 2))


def test_a_pipeline_is_chosen_where_only_point_to_point_messages_are_cheap(tmp_path):
    """Sums of replicas and collectives dear, messages between two workers cheap: the data split pays
    the param sync, the feature split its collectives, the pipeline neither."""
    cfg = _mlp(tmp_path)
    choice = choose(cfg, 2, ALLREDUCE, RowKernels(), Rates(1e10, FAST, SLOW, SLOW, "test"), pipelines=True)
    assert choice.pipeline is not None and choice.pipeline[0] in ("gpipe", "1f1b", "zb")
    assert set(choice.dims.values()) == {-1}
    assert sorted(set(choice.locations.values())) == [0, 1]
    assert choice.step < 0.9 * min(choice.data_parallel, 1e9)
    chosen = with_choice(cfg, choice)  # the job it writes: plans, and its text reads back the same
    assert partition(chosen, 2).pipeline.micro_batches == choice.pipeline[1]
    again = parse_job(text_format.MessageToString(chosen.proto), "chosen.conf")
    assert again.proto.neuralnet.pipeline == chosen.proto.neuralnet.pipeline


def test_no_pipeline_unless_asked_or_clearly_faster(tmp_path):
    cfg = _mlp(tmp_path)
    cheap = Rates(1e10, FAST, FAST, FAST, "test")
    choice = choose(cfg, 2, ALLREDUCE, RowKernels(), cheap, pipelines=True)
    assert choice.pipeline is None and choice.fastest_pipeline is not None
    assert choose(cfg, 2, ALLREDUCE, RowKernels(), Rates(1e10, FAST, SLOW, SLOW, "test")).pipeline is None


def held_memory(the_plan) -> int:
    """plan_memory less the passing arrays (a pass's work arrays, of one micro-batch's rows in a pipeline)."""
    return max(sum(n for (_, what), n in parts.items() if what != "passing arrays") for parts in memory_by_rank(the_plan))


def test_1f1b_is_predicted_to_hold_fewer_activations_than_gpipe(tmp_path):
    gpipe = nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", 64, "stages", 2), 8, "gpipe"))
    one_f_one_b = nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", 64, "stages", 2), 8, "1f1b"))
    plain = nets.job(nets.mlp("/tmp/unused.h5", 64, "stages", 2))
    assert held_memory(partition(gpipe, 2)) == held_memory(partition(plain, 2))  # every micro-batch held
    assert plan_memory(partition(one_f_one_b, 2)) < plan_memory(partition(gpipe, 2))
    zero_bubble = nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", 64, "stages", 2), 8, "zb"))
    assert plan_memory(partition(one_f_one_b, 2)) <= plan_memory(partition(zero_bubble, 2)) \
        < plan_memory(partition(gpipe, 2))  # ZB holds up to S micro-batches on every stage


def test_interleaved_is_priced_over_runs_of_layers_dealt_round_robin(tmp_path):
    """The interleaved candidate's placement: the net cut into two runs per worker, dealt 0, 1, 0, 1;
    the contiguous schedules' placement: one run per worker."""
    from singa_mpi.cost.auto import stage_locations

    cfg = _mlp(tmp_path)
    cheap = Rates(1e10, FAST, FAST, FAST, "test")
    names = list(dict.fromkeys(layer.name for layer in cfg.proto.neuralnet.layer))

    def runs(locations):
        workers = [locations[name] for name in names]
        return [w for i, w in enumerate(workers) if i == 0 or workers[i - 1] != w]

    assert runs(stage_locations(cfg, 2, ALLREDUCE, RowKernels(), cheap, "interleaved")) == [0, 1, 0, 1]
    assert runs(stage_locations(cfg, 2, ALLREDUCE, RowKernels(), cheap, "1f1b")) == [0, 1]
    interleaved = nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", 64, "pipeline", 2), 8, "interleaved"))
    plain = nets.job(nets.mlp("/tmp/unused.h5", 64, "pipeline", 2))
    assert held_memory(partition(interleaved, 2)) == held_memory(partition(plain, 2))  # counted as GPipe: all held


def test_a_heavy_layer_at_the_cut_is_split_over_both_stages(tmp_path):
    """data -> fc1 (8) -> fc2 (400 outputs: nearly all the work) -> fc3 -> loss.  Whole layers cannot
    balance two stages (fc2 is on one side); splitting fc2 over both workers at the cut can, and its
    exchanges, sent as messages, keep the stages apart: the fastest pipeline priced is that one."""
    from nets import _data_layer, _ip, _loss, job_text
    from singa_mpi.cost.auto import shared_cuts

    data = nets.make_data(str(tmp_path / "d.h5"), 64, (12,), 5)
    cfg = nets.job(job_text([_data_layer(data, 32, (12,)), _ip("fc1", "data", 8), _ip("fc2", "fc1", 400),
                             _ip("fc3", "fc2", 5), _loss("fc3")], 2))
    names = [layer.name for layer in cfg.proto.neuralnet.layer]
    cut = {"data": 0, "fc1": 0, "fc2": 1, "fc3": 1, "loss": 1}
    assert [{n: d for n, d in dims.items() if d != -1} for dims in shared_cuts(names, cut, 2, "1f1b")] == \
        [{"fc2": 0}, {"fc2": 1}, {"fc1": 0}, {"fc1": 1}]
    assert shared_cuts(names, cut, 2, "interleaved") == [] and shared_cuts(names, cut, 3, "1f1b") == []
    cheap = Rates(1e10, FAST, FAST, FAST, "test")
    piped = choose(cfg, 2, ALLREDUCE, RowKernels(), cheap, pipelines=True).fastest_pipeline
    assert piped is not None and piped.pipeline[0] != "interleaved"
    assert piped.dims["fc2"] in (0, 1) and piped.split_note() == \
        f" but fc2 split on {'the batch' if piped.dims['fc2'] == 0 else 'features'} over both"
    whole = dict.fromkeys(piped.dims, -1)  # the same stages and schedule, every layer whole
    search = Search(cfg, 2, ALLREDUCE, RowKernels(), cheap, None)
    assert piped.step < 0.7 * search.price(whole, dataclasses.replace(piped, dims=whole))


def test_the_jobs_own_stages_give_way_where_every_layer_is_chosen(tmp_path):
    """A hand-made 1F1B pipeline (layers at location 1, neuralnet.pipeline): `plan --auto` used to plan
    those locations on the one worker that times the stages ("location = 1: expected a worker id below
    the number of workers (1)"); the written job keeps neither the job's locations nor its pipeline
    unless the choice is a pipeline."""
    cfg = nets.job(nets.pipelined(nets.mlp("/tmp/unused.h5", 64, "stages", 2), 2, "1f1b"))
    assert {layer.location for layer in cfg.proto.neuralnet.layer} == {0, 1}
    cheap = Rates(1e10, FAST, FAST, FAST, "test")
    choice = choose(cfg, 2, ALLREDUCE, RowKernels(), cheap, pipelines=True)
    assert choice.pipeline is None and choice.fastest_pipeline is not None and choice.places_layers()
    chosen = with_choice(cfg, choice)
    assert not chosen.proto.neuralnet.HasField("pipeline")
    assert all(layer.location == 0 for layer in chosen.proto.neuralnet.layer)
    assert partition(chosen, 2).pipeline is None


def _wide_mlp(batch: int = 64, width: int = 6000):
    from nets import _act, _data_layer, _ip, _loss, job_text

    return nets.job(job_text([_data_layer("/tmp/unused.h5", batch, (784,)), _ip("fc1", "data", width),
                              _act("act1", "fc1", "kSTanh"), _ip("fc2", "act1", 10), _loss("fc2")]))


def test_a_pipeline_is_chosen_where_only_a_pipeline_fits_the_memory_limit(tmp_path):
    """A 784-6000-10 MLP at 120 MiB per rank: no partitioning fits (the replicated or split weights with
    their gradients and history, and on rank 0 the checkpoint's copies of them all), a 1F1B pipeline
    does; the search used to stop at the partitionings."""
    from cost_support import rates

    cfg, limit = _wide_mlp(), 120 * 2**20
    choice = choose(cfg, 2, ALLREDUCE, RowKernels(), rates(), memory_limit=limit, pipelines=True)
    assert choice.pipeline is not None and choice.memory <= limit
    assert choice.data_parallel is None and choice.data_refusal.startswith("over the memory limit (")
    with pytest.raises(ConfigError, match=r"fits 80 MiB per rank \(the smallest needs \d+\.\d MiB on its fullest "
                                          r"rank\): expected a larger --memory-limit$"):
        choose(cfg, 2, ALLREDUCE, RowKernels(), rates(), memory_limit=80 * 2**20, pipelines=True)


def test_fewer_rows_than_workers_is_said_as_the_planner_says_it():
    """A batch of 4 on 7 workers: no plan at all, whatever the memory (it used to ask for fewer workers
    or a larger memory limit)."""
    from cost_support import rates

    with pytest.raises(ConfigError) as err:
        choose(_wide_mlp(batch=4, width=16), 7, ALLREDUCE, RowKernels(), rates(), pipelines=True)
    assert "is plannable; every layer on the batch: " in str(err.value) and "memory" not in str(err.value)
