"""Deterministic mode: the same job and seed train the same bits on any number of workers.

Every rank trains the job in deterministic mode partitioned over the world and alone in one process
(the serial run): after 30 steps the params and the updater's state must be **bitwise** equal (their
SHA-256 digests), under every scheme the mode accepts (on the batch, whole layers placed on workers,
a data-split stage before placed layers), with a batch the blocks divide and one they do not, for an
MLP (with dropout too), a convnet (max and average pooling, LRN), an RBM (CD-1, CD-2) and a char-rnn
GRU (BPTT), and with momentum and adaptive rules.  A run stopped at step 12 on this many workers and resumed on
one ends equal to the uninterrupted serial run too.
"""
import hashlib
import os
import pathlib
import re

import pytest
from google.protobuf import text_format

import nets
import oracle
from conftest import agree
from singa_mpi.proto import job_pb2

STEPS = 30


def _digests(ckpt) -> dict[str, str]:
    """SHA-256 of every param and updater-state array (their bytes, not the file's)."""
    arrays = dict(ckpt.params)
    arrays.update({f"{name}/{slot}": value for name, slots in ckpt.updater.items() for slot, value in slots.items()})
    return {name: hashlib.sha256(value.tobytes()).hexdigest()[:16] for name, value in sorted(arrays.items())}


def _deterministic(text: str, block_rows: int) -> str:
    return f"deterministic {{ block_rows: {block_rows} }}\n" + text


def _differences(got, want) -> list[str]:
    if got is None:  # off rank 0: the root compares the whole arrays
        return []
    ours, serial = _digests(got), _digests(want)
    diff = [name for name in serial if ours.get(name) != serial[name]]
    return [f"not bitwise equal to the serial run: {', '.join(diff)}"] if diff or sorted(ours) != sorted(serial) else []


def _data(world, shape=(12,)) -> str:
    tmp = os.environ["SINGA_MPI_TEST_TMP"]
    return nets.make_data(os.path.join(tmp, f"det_data_{len(shape)}_r{world.rank}.h5"), 96, shape, 5)


def _trains_serial_bits(world, text: str, label: str) -> None:
    workspace = oracle.scratch(f"ws_det_{label}", world.rank)
    parallel, serial = oracle.partitioned(text, workspace, world), oracle.serial(text, workspace)
    parallel.run()
    serial.run()
    problems = _differences(oracle.snapshot(parallel, STEPS), oracle.snapshot(serial, STEPS))
    problems += _metric_differences(parallel, serial)
    parallel.runtime.close()  # its last sends and communicators (MPICH counts what is left at exit)
    agree(world, not problems, f"{label}: " + "; ".join(problems))


def _metric_differences(parallel, serial) -> list[str]:
    """The metrics every step printed (loss, accuracy, squared error): the serial run's, exactly."""
    def printed(trainer):
        return [{k: v for k, v in entry.items() if k in ("loss", "accuracy", "squared_error")}
                for entry in trainer.history if entry["phase"] == "train"]
    ours, theirs = printed(parallel), printed(serial)
    if not theirs or not any(theirs):
        return ["the serial run printed no metrics"]
    return [] if ours == theirs else [f"printed metrics differ from the serial run's: {ours[:2]} against {theirs[:2]}"]


@pytest.mark.parametrize("batch,block_rows", [(16, 4), (19, 4), (24, 3)])
@pytest.mark.parametrize("scheme", ["data", "stages", "stages-hybrid", "pipeline"])
def test_an_mlp_trains_the_serial_bits(world, scheme, batch, block_rows):
    if scheme in ("stages", "stages-hybrid") and world.size > 1 and batch < world.size:
        pytest.skip("fewer rows than workers")
    text = _deterministic(nets.mlp(_data(world), batch, scheme, world.size, STEPS), block_rows)
    _trains_serial_bits(world, text, f"{scheme}-b{batch}-r{block_rows}")


@pytest.mark.parametrize("route", ["im2col", "fourier"])
@pytest.mark.parametrize("batch", [16, 19])
@pytest.mark.parametrize("scheme,lrn,pool", [("data", True, "MAX"), ("data", False, "AVG"), ("stages", False, "MAX")])
def test_a_convnet_trains_the_serial_bits(world, scheme, lrn, pool, batch, route, monkeypatch):
    """Convolutions (their products per block of samples by either route, their gradients one term
    per block), max and average pooling, LRN: a max pooling's choices are where rounding used to
    flip a run."""
    if scheme == "stages" and batch < world.size:
        pytest.skip("fewer rows than workers")
    # the route is the cost model's choice from the shapes: force each (serial and partitioned alike)
    monkeypatch.setattr("singa_mpi.layers.fft_conv.cheaper", lambda *args, **kwargs: route == "fourier")
    text = nets.convnet(_data(world, (2, 8, 8)), batch, scheme, STEPS, lrn=lrn, pool=pool, nranks=world.size)
    _trains_serial_bits(world, _deterministic(text, 4), f"convnet-{route}-{scheme}-{pool}-lrn{lrn}-b{batch}")


@pytest.mark.parametrize("scheme,batch,cd_k", [("data", 16, 1), ("data", 19, 1), ("data", 16, 2), ("data", 19, 2),
                                              ("location", 19, 1)])
def test_an_rbm_trains_the_serial_bits_with_contrastive_divergence(world, scheme, cd_k, batch):
    """CD-k: the hidden layer's products per block, its Gibbs samples keyed by row, W's and the
    biases' gradients as terms per row (two per row for the hidden layer's: the positive and the
    negative phase); on the batch, or each layer whole on a worker."""
    text = nets.rbm(_data(world), batch, scheme, cd_k, world.size, STEPS)
    _trains_serial_bits(world, _deterministic(text, 4), f"rbm-{scheme}-cd{cd_k}-b{batch}")


@pytest.mark.parametrize("scheme,batch", [("data", 8), ("data", 9), ("location", 9)])
def test_a_char_rnn_trains_the_serial_bits_with_bptt(world, scheme, batch):
    """BPTT over a GRU unrolled 5 steps (each copy's products per block, its gradients one set of row
    terms per copy, summed in the order the copies recorded them), the hidden state carried from
    batch to batch, RMSProp with clipping; on the batch, or the layers whole on workers (a pipeline)."""
    if scheme == "data" and batch < 2 * world.size:
        pytest.skip("fewer blocks than workers")
    text, vocab = nets.text_data(oracle.scratch(f"det_text_{batch}", world.rank), size=40 * batch)
    job = nets.char_rnn(text, vocab, batch, scheme, world.size, steps=STEPS)
    _trains_serial_bits(world, _deterministic(job, 2), f"char-rnn-{scheme}-b{batch}")


# the example jobs: (file, sample shape, rows per batch, rows per block, widths of the shrunk MLP)
EXAMPLES = {"digits_mlp": ("digits_mlp.conf", (64,), 19, 4, None),
            "mnist_mlp (shrunk)": ("mnist_mlp.conf", (784,), 16, 4,
                                   {"2500": "50", "2000": "40", "1500": "30", "1000": "20", "500": "15"}),
            "cifar10_convnet (small batch)": ("cifar10_convnet.conf", (3, 32, 32), 8, 2, None)}


def _example(world, name: str) -> str:
    """The job of conf/ on synthetic data of its shapes: its stores replaced, a small batch, 30 steps."""
    conf, shape, batch, block_rows, widths = EXAMPLES[name]
    text = (pathlib.Path(__file__).resolve().parents[2] / "conf" / conf).read_text()
    data = nets.make_data(oracle.scratch(f"det_{conf}.h5", world.rank), 4 * batch, shape, 10)
    text = re.sub(r'backend: "\w+"', 'backend: "hdf5"', text)
    text = re.sub(r'path: "[^"]*"', f'path: "{data}"', text)
    text = re.sub(r"(mean_file|std_file): \"[^\"]*\"|random_skip: \d+", "", text)
    text = re.sub(r"batchsize: \d+", f"batchsize: {batch}", text)
    for wide, narrow in (widths or {}).items():
        text = text.replace(f"num_output: {wide} ", f"num_output: {narrow} ")
    text = re.sub(r"train_steps: \d+", f"train_steps: {STEPS}", text)
    text = re.sub(r"(test_steps|test_freq|checkpoint_freq): \d+", r"\1: 0", text)
    text = re.sub(r"disp_freq: \d+", "disp_freq: 1", text)  # every step's metrics, compared too
    return _deterministic(text, block_rows)


def _in_stages(text: str, nranks: int) -> str:
    """The job with every layer whole on a worker, in contiguous runs of about equal length (a
    pipeline of ``nranks`` stages), whatever its file said."""
    job = text_format.Parse(text, job_pb2.JobProto())
    layers = job.neuralnet.layer
    for index, layer in enumerate(layers):
        layer.partition_dim, layer.location = -1, index * nranks // len(layers)
    return text_format.MessageToString(job)


# the example MLPs also in stages; the CIFAR-10 convnet in stages would take 2 minutes at 4 ranks on
# 2 cores (the synthetic convnet is tested in stages above)
EXAMPLE_SCHEMES = [(name, "as written") for name in sorted(EXAMPLES)] + [("digits_mlp", "stages"),
                                                                          ("mnist_mlp (shrunk)", "stages")]


@pytest.mark.parametrize("name,scheme", EXAMPLE_SCHEMES)
def test_the_example_jobs_train_the_serial_bits(world, name, scheme):
    text = _example(world, name)
    if scheme == "stages":
        text = _in_stages(text, world.size)
    _trains_serial_bits(world, text, f"{name.split()[0]}-{scheme.replace(' ', '-')}")


@pytest.mark.parametrize("rule", ["adam", "rmsprop"])
def test_adaptive_updaters_keep_the_serial_bits(world, rule):
    text = _deterministic(nets.mlp(_data(world), 19, "data", world.size, STEPS, updater=nets.updater(rule)), 4)
    _trains_serial_bits(world, text, f"updater-{rule}")


def test_dropout_keeps_the_serial_bits(world):
    text = _deterministic(nets.mlp_dropout(_data(world), 19, "data", steps=STEPS, nranks=world.size), 4)
    _trains_serial_bits(world, text, "dropout")


def test_a_run_resumed_on_one_worker_ends_with_the_serial_bits(world):
    """Steps 0-11 on this world, a checkpoint, steps 12-29 serially from it: the uninterrupted
    serial run's bits (what a resume on another rank count does: `train --resume` loads the same)."""
    text = _deterministic(nets.mlp(_data(world), 19, "data", world.size, STEPS), 4)
    workspace = oracle.scratch("ws_det_resume", world.rank)
    first = oracle.partitioned(text, workspace, world)
    for index in range(12):
        oracle.step(first, index)
    middle = world.root_value(oracle.snapshot(first, 12), "checkpoint")
    first.runtime.close()
    resumed, straight = oracle.serial(text, workspace + "_b"), oracle.serial(text, workspace + "_c")
    oracle.load(resumed, middle)
    for index in range(12, STEPS):
        oracle.step(resumed, index)
    for index in range(STEPS):
        oracle.step(straight, index)
    problems = _differences(oracle.snapshot(resumed, STEPS), oracle.snapshot(straight, STEPS))
    agree(world, not problems, "resume: " + "; ".join(problems))


@pytest.mark.parametrize("net", ["mlp", "convnet"])
@pytest.mark.parametrize("nservers", [1, 2])
def test_sandblaster_trains_the_serial_bits(world, net, nservers):
    """Workers beside server ranks: the workers gather their terms and form their tiles, each sends
    its gradient with the others' tiles as negative zeros, the servers add one value per element and
    apply the updater (momentum: its state on the servers, in the checkpoint too) to ranges that cut
    the params where SINGA's slicing puts them (each element updated as in the whole array)."""
    nworkers = world.size - nservers
    if nworkers < 1 or (nservers == 2 and nworkers < 2):
        pytest.skip(f"{nservers} server(s) beside workers need more ranks")
    if net == "mlp":
        text = nets.mlp(_data(world), 19, "data", nworkers, STEPS).replace("num_output: 16", "num_output: 600")
    else:
        text = nets.convnet(_data(world, (2, 8, 8)), 19, "data", STEPS, lrn=True, pool="MAX", nranks=nworkers)
    text = _deterministic(text, 4)
    workspace = oracle.scratch(f"ws_det_servers_{net}_{nservers}", world.rank)
    trainer = oracle.with_servers(text, workspace, world, nservers)
    problems = []
    if trainer is not None:
        serial = oracle.serial(text, workspace + "_serial")
        oracle.train(trainer)
        oracle.train(serial)
        problems = _differences(oracle.snapshot(trainer, STEPS), oracle.snapshot(serial, STEPS))
    oracle.finish(trainer)
    agree(world, not problems, f"sandblaster {net} {nservers} server(s): " + "; ".join(problems))


@pytest.mark.parametrize("scheme,batch", [("data", 16), ("data", 19), ("stages", 19)])
def test_batch_norm_trains_the_serial_bits(world, scheme, batch):
    """Batch norm's statistics (Σx, Σx² forward; Σdy, Σdy·x̂ backward) as one partial sum per
    canonical block, exchanged at their places in the batch and added in block order; its scale's
    and bias's gradients one term per block; its running statistics the serial run's too."""
    if scheme == "stages" and batch < world.size:
        pytest.skip("fewer rows than workers")
    text = nets.convnet(_data(world, (2, 8, 8)), batch, scheme, STEPS, bn=True, nranks=world.size)
    _trains_serial_bits(world, _deterministic(text, 4), f"batch-norm-{scheme}-b{batch}")
