"""Scaling benchmark: samples/s of the example nets under data, feature and hybrid partitioning.

    python scripts/bench_scaling.py [--ranks 1 2 4] [--steps 30] [--repeat 3] [--weak [ROWS]] [--json results.json]

For mnist_mlp (batch 64) and cifar10_convnet (batch 100) on synthetic data, each scheme runs under
`mpiexec -n N` (one BLAS thread per rank) and reports samples/s, the speed-up over N = 1, the share
of step time spent inside communication calls that computation did not hide (exposed communication:
blocking exchanges, waits for gradient sums, shared-memory fences and sums), and the bytes rank 0
moved per step (measured: MPI messages plus what it read from other ranks' shared memory).

A shared VM's speed drifts by several per cent within a minute, so every configuration runs
``--repeat`` times, the rank counts of one repeat back to back: the table gives the median samples/s,
the speed-up of the medians with the range of the per-repeat speed-ups, and the speed-up of the
fastest runs ("best").  Runs that use every core are the ones other processes on the machine slow
down (on 2 cores: every 2-rank run; a synchronous step waits for its slowest rank), so the fastest
run is the closest to what the code itself does, as with timeit; the median is what a user sees.  On a 2-core machine
N = 4 oversubscribes the cores: those rows are marked and say nothing about speed.

Schemes: data = every layer partition_dim 0; feature = inner-product/convolution layers and the
element-wise layers after them partition_dim 1 (LRN, loss and input stay on the batch); hybrid =
convolution part on the batch, inner products on features (for the MLP: the first three layers on
the batch, the last three on features); pipeline (not run by default: it cannot scale, one worker
waits while the other computes) = whole layers in contiguous stages of about equal predicted time, one
per worker (the stages ``plan --auto`` prices, chosen once per run from this machine's kernel times);
gpipe-M, 1f1b-M, zb-M = that pipeline over M micro-batches; auto-pipeline = the fastest pipeline
``plan --auto`` prices (its schedule, micro-batches, stages, and on two workers a layer at the cut
split over both), chosen once per run.  Any scheme followed by ``+det`` (or ``+detN``)
runs it in deterministic mode with the mode's blocks for the job's batch (blocks of N rows):
``--schemes data data+det`` measures what the mode costs, side by side.

Each run prints a line as it ends, each scheme once measured the table so far; Ctrl-C or SIGTERM
(a time limit) prints the table of the runs done.  A run that fails is said in one line (the run and
the line of its output that says why) and the other runs go on; the table and --json (its "failed"
list) then keep what was measured, and the exit code is 1.
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from benchkit import bench_env, blas_threads_as_train, mpiexec_command, positive_int, report_if_cut_short  # noqa: E402

NETS = {"mnist_mlp": ("mnist_mlp.conf", (784,), 64), "cifar10_convnet": ("cifar10_convnet.conf", (3, 32, 32), 100)}
SCHEME_NAMES = ["data", "feature", "hybrid", "pipeline", "auto", "auto-pipeline"]
AUTO_PIPELINE = "auto-pipeline"
FEATURE_TYPES = {"kInnerProduct", "kConvolution", "kCConvolution", "kReLU", "kSTanh", "kPooling", "kCPooling"}


def partitioned(cfg, scheme: str, dims: dict[str, int] | None = None, stages: int = 2):
    """Set partition_dim per layer for the scheme (in place); ``auto``: as ``dims`` says; ``pipeline``,
    ``gpipe-M``, ``1f1b-M``, ``zb-M``, ``interleaved-M``: whole layers in ``stages`` stages (M micro-batches), each layer's
    stage as ``dims`` says or, without it, chosen here (:func:`place_in_stages`)."""
    from singa_mpi.proto import job_pb2

    scheme, block_rows = deterministic_of_scheme(scheme)
    if block_rows is not None:
        cfg.proto.deterministic.SetInParent()  # (+det: the mode's blocks for the job's batch)
    if block_rows:
        cfg.proto.deterministic.block_rows = block_rows
    layers = list(cfg.proto.neuralnet.layer)
    if scheme == AUTO_PIPELINE:
        return as_auto_pipeline(cfg, dims)
    if scheme == "auto":
        for layer in layers:
            layer.partition_dim = dims[layer.name]
            if layer.partition_dim == -1:
                layer.location = 0
        return cfg
    ips = [layer.name for layer in layers if layer.type == job_pb2.kInnerProduct]
    for layer in layers:
        type_name = job_pb2.LayerType.Name(layer.type)
        if scheme == "data":
            layer.partition_dim = 0
        elif scheme == "pipeline" or pipeline_of_scheme(scheme):  # whole layers in stages, one per worker
            layer.partition_dim = -1
        elif scheme == "feature":
            layer.partition_dim = 1 if type_name in FEATURE_TYPES else 0
        else:  # hybrid
            convnet = any(t.type in (job_pb2.kConvolution, job_pb2.kCConvolution) for t in layers)
            if convnet:
                layer.partition_dim = 1 if layer.type == job_pb2.kInnerProduct else 0
            else:
                second_half = ips[len(ips) // 2:]
                idx = layers.index(layer)
                follows = idx > 0 and layers[idx - 1].name in second_half and type_name in FEATURE_TYPES
                layer.partition_dim = 1 if (layer.name in second_half or follows) else 0
    if scheme == "pipeline" or pipeline_of_scheme(scheme):
        micro = pipeline_of_scheme(scheme)
        place_in_stages(cfg, stages, dims, micro[0] if micro else "")
        if micro:
            cfg.proto.neuralnet.pipeline.schedule, cfg.proto.neuralnet.pipeline.micro_batches = micro
    return cfg


def as_auto_pipeline(cfg, chosen: dict | None):
    """``cfg`` (in place) as :func:`auto_pipeline` chose: each layer's partition_dim and worker, and the
    pipeline setting (none on one rank)."""
    if chosen is None:
        raise ValueError("auto-pipeline needs the layout chosen by auto_pipeline()")
    for layer in cfg.proto.neuralnet.layer:
        layer.partition_dim = chosen["dims"][layer.name]
        layer.location = chosen["locations"].get(layer.name, 0)
    if chosen["pipeline"]:
        cfg.proto.neuralnet.pipeline.schedule, cfg.proto.neuralnet.pipeline.micro_batches = chosen["pipeline"]
    return cfg


def pipeline_of_scheme(scheme: str) -> tuple[str, int] | None:
    """(schedule, micro-batches) of a scheme named ``gpipe-M``, ``1f1b-M``, ``zb-M`` or ``interleaved-M``, else None."""
    from singa_mpi.planner.pipeline import SCHEDULES

    name, _, count = scheme.partition("-")
    return (name, int(count)) if name in SCHEDULES and count.isdigit() and int(count) > 0 else None


DETERMINISTIC_SUFFIX = "+det"


def deterministic_of_scheme(scheme: str) -> tuple[str, int | None]:
    """(the scheme, deterministic mode's block rows) of ``SCHEME+detN`` (N rows per block; 0 for ``+det``:
    the mode's default for the job's batch; None: the default mode, or a suffix that is no number)
    (docs/deterministic.md)."""
    base, _, rows = scheme.partition(DETERMINISTIC_SUFFIX)
    if base == scheme:
        return scheme, None
    if rows == "":
        return base, 0
    return base, int(rows) if rows.isdigit() and int(rows) > 0 else None


def scheme_name(text: str) -> str:
    """An argparse type: one of SCHEME_NAMES, or a pipelined scheme (gpipe-M, 1f1b-M), any of them with
    ``+det`` or ``+detN`` (deterministic mode, N rows per block)."""
    base, rows = deterministic_of_scheme(text)
    if (base in SCHEME_NAMES or pipeline_of_scheme(base)) and (rows is not None or text == base):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: expected one of {', '.join(SCHEME_NAMES)}, gpipe-M, 1f1b-M, zb-M or interleaved-M, "
                                     f"optionally followed by +det or +detN (deterministic mode)")


def place_in_stages(cfg, stages: int, locations: dict[str, int] | None = None, schedule: str = "") -> None:
    """Each layer whole on one of ``stages`` workers: at ``locations`` (name -> stage), or where
    ``plan --auto`` places them for ``schedule`` (its kernel times: contiguous stages of about equal
    predicted time; interleaved: runs of layers dealt round robin)."""
    from singa_mpi.cost.auto import timed_stage_locations

    if locations is None:
        locations = timed_stage_locations(cfg, stages, schedule=schedule)
    for layer in cfg.proto.neuralnet.layer:
        layer.location = locations[layer.name]


ONE_RANK_BATCH = -1  # --weak without a number: every rank keeps the 1-rank batch


def weak_rows(weak) -> int:
    """Rows per rank of weak scaling: ``weak`` is 0 (strong scaling), ONE_RANK_BATCH or True (the
    1-rank batch), or a row count."""
    return ONE_RANK_BATCH if weak is True else int(weak)


def weak_flag(weak) -> list[str]:
    """The worker's --weak option for ``weak`` (see :func:`weak_rows`)."""
    rows = weak_rows(weak)
    return [] if rows == 0 else ["--weak"] if rows == ONE_RANK_BATCH else ["--weak", str(rows)]


def weak_batch(cfg, ranks: int, weak=ONE_RANK_BATCH) -> None:
    """Weak scaling: the training batch grows with the ranks, each rank taking the 1-rank batch or
    ``weak`` rows (:func:`weak_rows`)."""
    rows = weak_rows(weak)
    for layer in cfg.proto.neuralnet.layer:
        if layer.HasField("store_conf"):  # batchsize is repeated in SINGA's schema (one per split)
            sizes = [(rows if rows > 0 else size) * ranks for size in layer.store_conf.batchsize]
            del layer.store_conf.batchsize[:]
            layer.store_conf.batchsize.extend(sizes)


def layout(net: str, scheme: str, ranks: int, weak: int = 0) -> dict | None:
    """What the cost model chooses once for every rank of a run: ``auto``'s partition_dim per layer, a
    pipeline's stage per layer; None for the other schemes (they need no choice)."""
    if scheme == "auto":
        return auto_dims(net, ranks, weak)
    if scheme == AUTO_PIPELINE:
        return auto_pipeline(net, ranks, weak)
    piped = pipeline_of_scheme(deterministic_of_scheme(scheme)[0])
    if scheme == "pipeline" or piped:
        from singa_mpi.cost.auto import timed_stage_locations
        from bench_serial import job_on_synthetic_data

        conf, shape, _ = NETS[net]
        with tempfile.TemporaryDirectory() as folder:
            cfg = job_on_synthetic_data(conf, folder, shape, 16)
            if weak:
                weak_batch(cfg, ranks, weak)
            return timed_stage_locations(cfg, ranks, schedule=piped[0] if piped else "")
    return None


def auto_dims(net: str, ranks: int, weak: int = 0) -> dict[str, int]:
    """The cost model's choice (singa_mpi.cost.auto) for ``net`` on ``ranks`` ranks of this machine."""
    from singa_mpi.cost.auto import choose_for_job
    from singa_mpi.planner import SHARED_MEMORY
    from bench_serial import job_on_synthetic_data

    conf, shape, _ = NETS[net]
    with tempfile.TemporaryDirectory() as folder:
        cfg = job_on_synthetic_data(conf, folder, shape, 16)
        if weak:
            weak_batch(cfg, ranks, weak)
        return choose_for_job(cfg, ranks, SHARED_MEMORY, every_layer=True).dims


def auto_pipeline(net: str, ranks: int, weak: int = 0) -> dict:
    """The fastest pipeline ``plan --auto`` prices for ``net`` on ``ranks`` ranks of this machine, as
    JSON-ready data (on one rank: every layer whole on it, no pipeline)."""
    from singa_mpi.cost.auto import choose_for_job
    from singa_mpi.planner import SHARED_MEMORY
    from bench_serial import job_on_synthetic_data

    conf, shape, _ = NETS[net]
    with tempfile.TemporaryDirectory() as folder:
        cfg = job_on_synthetic_data(conf, folder, shape, 16)
        if weak:
            weak_batch(cfg, ranks, weak)
        names = [layer.name for layer in cfg.proto.neuralnet.layer]
        if ranks == 1:
            return {"dims": dict.fromkeys(names, -1), "locations": dict.fromkeys(names, 0), "pipeline": None}
        piped = choose_for_job(cfg, ranks, SHARED_MEMORY, every_layer=True, pipelines=True).fastest_pipeline
    if piped is None:
        raise RuntimeError(f"{net}: plan --auto priced no pipeline on {ranks} ranks")
    return {"dims": piped.dims, "locations": piped.locations, "pipeline": list(piped.pipeline)}


def trainer_on_world(net: str, scheme: str, prefix: str, weak: int = 0, dims: dict | None = None):
    """(world, scratch folder, runtime, trainer) of an example net on synthetic data, partitioned
    by ``scheme`` over the MPI world (call under mpiexec); ``weak``: weak scaling (:func:`weak_rows`)."""
    from bench_serial import job_on_synthetic_data
    from singa_mpi.communication import mpi as comm_module
    from singa_mpi.runtimes.worker import WorkerRuntime
    from singa_mpi.trainer import Trainer

    world = comm_module.world()
    conf, shape, _ = NETS[net]
    if dims is None:  # launched directly (srun, sbatch): rank 0 chooses for all
        dims = world.root_value(layout(net, scheme, world.size, weak) if world.rank == 0 else None, "layout")
    folder = tempfile.mkdtemp(prefix=f"{prefix}_r{world.rank}_")
    cfg = partitioned(job_on_synthetic_data(conf, folder, shape, (2048 if net == "mnist_mlp" else 1000)
                                            * (world.size if weak else 1)), scheme, dims, world.size)
    if weak:
        weak_batch(cfg, world.size, weak)
    runtime = WorkerRuntime(cfg, 1, folder, world)
    return world, folder, runtime, Trainer(cfg, folder, runtime, log=lambda line: None)


def measure(net: str, scheme: str, steps: int, weak: int = 0, dims: dict | None = None) -> dict | None:
    """Under mpiexec: time the training step of one net and scheme in the current world; rank 0 gets
    the result (the others None).  Each rank runs with the BLAS threads `singa-mpi train` would give it
    (one when launched by this script: bench_env)."""
    from singa_mpi.progress import peak_rss

    world, folder, runtime, trainer = trainer_on_world(net, scheme, "bench_scaling", weak, dims)
    blas = world.allgather_object(blas_threads_as_train(trainer.cfg, runtime.size))
    for step in range(3):
        trainer.train_one_batch(step)
    world.barrier()
    world.tracer.reset()
    times = []
    for step in range(steps):
        world.barrier()
        start = time.perf_counter()
        trainer.train_one_batch(3 + step)
        times.append(time.perf_counter() - start)
    timed = {label: a for label, a in world.tracer.by_name("comm").items() if label != "barrier"}  # not the timing barrier
    comm_s = sum(a.seconds for a in timed.values()) / steps
    moved = sum(a.bytes for a in timed.values()) / steps
    slowest = max(world.allgather_object(statistics.median(times)))
    shares = world.allgather_object(comm_s)
    peaks = [p for p in world.allgather_object(peak_rss()) if p]
    step_memory = world.allgather_object(step_allocations(trainer, 3 + steps))
    batch = trainer.batch
    runtime.close()
    shutil.rmtree(folder, ignore_errors=True)
    if world.rank != 0:
        return None
    return {"net": net, "scheme": scheme, "ranks": world.size, "batch": batch,
            "step_ms": 1e3 * slowest, "samples_per_s": batch / slowest,
            "exposed_comm_share": max(shares) / slowest, "bytes_per_step": moved,
            "cores": os.cpu_count(), "weak": bool(weak), "peak_rss_max": max(peaks) if peaks else None,
            "blas_threads": blas, "step_allocations": step_memory}


def step_allocations(trainer, step: int) -> int:
    """Peak bytes one more training step allocates beyond what it starts with (tracemalloc, which numpy
    reports its arrays to): the step's activations, gradients passed down and temporaries.  After the
    timed steps (tracing slows allocations)."""
    import tracemalloc

    tracemalloc.start()
    start = tracemalloc.get_traced_memory()[0]
    trainer.train_one_batch(step)
    peak = tracemalloc.get_traced_memory()[1] - start
    tracemalloc.stop()
    return peak


def worker(args) -> int:
    """Runs under mpiexec: time the training step of one net and scheme, print JSON on rank 0."""
    dims = json.loads(args.dims) if args.dims else None
    result = measure(args.net, args.scheme, args.steps, args.weak, dims)
    if result is not None:
        line = json.dumps(result)
        print(line)
        if args.out:
            write_atomically(pathlib.Path(args.out), line + "\n")
    return 0


def write_atomically(path: pathlib.Path, text: str) -> None:
    """``text`` into ``path`` through a temporary file beside it and a rename: a job killed while
    writing (a time limit) leaves no half-written result for --collect to read."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)


# The tasks of slurm/bench.sbatch's array, in its order (its NETS and SCHEMES): what a campaign expects
# at each rank count.
CAMPAIGN_TASKS = [(net, scheme) for net in NETS for scheme in ("data", "feature", "hybrid")]


def missing_results(runs: list[dict], ranks: list[int]) -> list[str]:
    """The campaign's tasks at ``ranks`` that left no result in ``runs`` (they failed, or never ran)."""
    have = {(r["net"], r["scheme"], r["ranks"]) for r in runs}
    return [f"{net} {scheme} n={n}" for n in ranks for net, scheme in CAMPAIGN_TASKS if (net, scheme, n) not in have]


RESULT_KEYS = {"net", "scheme", "ranks", "batch", "samples_per_s", "step_ms", "exposed_comm_share", "bytes_per_step"}


def collected_runs(folder: str) -> list[dict]:
    """The worker results (JSON) in ``folder``; a file that is none (empty, cut short, another tool's)
    is skipped with a one-line warning naming it."""
    runs = []
    for path in sorted(pathlib.Path(folder).glob("*.json")):
        try:
            run = json.loads(path.read_text())
        except (OSError, ValueError):  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
            run = None
        if not isinstance(run, dict) or not RESULT_KEYS <= run.keys():
            print(f"warning: {path}: skipped: expected the JSON result of one bench_scaling.py --worker run",
                  file=sys.stderr, flush=True)
            continue
        runs.append(run)
    return runs


def refusal(net: str, scheme: str, ranks: int, weak: int = 0) -> str | None:
    """Why the planner refuses the scheme on ``ranks`` ranks (e.g. 10 outputs split 16 ways), else None."""
    from singa_mpi.errors import ConfigError
    from singa_mpi.planner import plan
    from bench_serial import job_on_synthetic_data

    if scheme in ("auto", AUTO_PIPELINE):
        return None  # the search only returns plans the planner accepts
    conf, shape, _ = NETS[net]
    with tempfile.TemporaryDirectory() as folder:
        cfg = partitioned(job_on_synthetic_data(conf, folder, shape, 16), scheme, stages=ranks)
        if weak:
            weak_batch(cfg, ranks, weak)
        try:
            plan(cfg, ranks)
        except ConfigError as err:
            return str(err).split(": ", 1)[-1][:160]
    return None


class RunFailed(RuntimeError):
    """One run (net, scheme, ranks) ended without a result; its message is one line: which run, and the
    line of its output that says why.  The loops report it and go on with the other runs."""


def error_tail(output: str) -> str:
    """The line of a failed run's output that says what went wrong: the last exception or error line
    (MPICH's clean-up banner and Open MPI's notices follow it), else the last line."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    for line in reversed(lines):
        if re.match(r"[\w.]*(Error|Exception)\b", line) or "error:" in line:
            return line[:300]
    return lines[-1][:300] if lines else "no output"


def launch(net: str, scheme: str, ranks: int, steps: int, weak: int = 0) -> dict:
    """Run one configuration under mpiexec; its result (RunFailed when it ends without one)."""
    what = f"{net} {scheme} n={ranks}"
    env = bench_env()  # one BLAS thread per rank; the launcher's MPI (SINGA_MPI_FLAVOR=openmpi|mpich)
    cmd = mpiexec_command(ranks) + [sys.executable, __file__, "--worker", "--net", net, "--scheme", scheme,
                                    "--steps", str(steps)] + weak_flag(weak)
    try:
        chosen = layout(net, scheme, ranks, weak)
    except RuntimeError as err:  # plan --auto priced no pipeline
        raise RunFailed(f"{what} failed: {err}") from None
    if chosen is not None:  # chosen once, here, so that every rank runs the same plan
        cmd += ["--dims", json.dumps(chosen)]
    try:
        out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=1800)
    except subprocess.TimeoutExpired:
        raise RunFailed(f"{what} failed: no result within 1800 s") from None
    lines = out.stdout.strip().splitlines()
    if out.returncode != 0 or not lines:
        raise RunFailed(f"{what} failed (exit {out.returncode}): {error_tail(out.stderr or out.stdout)}")
    result = json.loads(lines[-1])
    if chosen is not None:
        result["layout"] = chosen  # what ran: auto's partition_dims, a pipeline's stages
    return result


def summarize(runs: list[dict]) -> list[dict]:
    """One row per (net, scheme, ranks): medians over the repeats, the speed-up of the medians over
    one rank, and the range of the speed-ups of single repeats (each against its own 1-rank run)."""
    groups: dict[tuple, list[dict]] = {}
    for r in runs:
        groups.setdefault((r["net"], r["scheme"], bool(r.get("weak")), r["ranks"]), []).append(r)
    rows = []
    for (net, scheme, weak, ranks), group in sorted(groups.items()):
        base = groups.get((net, scheme, weak, 1), [])
        per_repeat = [r["samples_per_s"] / b["samples_per_s"] for r, b in zip(group, base)]
        row = {key: statistics.median(r[key] for r in group)
               for key in ("step_ms", "samples_per_s", "exposed_comm_share", "bytes_per_step")}
        peaks = [r["peak_rss_max"] for r in group if r.get("peak_rss_max")]
        row["peak_rss_max"] = max(peaks) if peaks else None
        if all(r.get("step_allocations") for r in group):  # per rank, the median over the repeats
            row["step_alloc_mib"] = [statistics.median(r["step_allocations"][i] for r in group) / 2**20
                                     for i in range(ranks)]
        row.update(net=net, scheme=scheme, weak=weak, ranks=ranks, batch=group[0]["batch"], repeats=len(group),
                   speedup=(row["samples_per_s"] / statistics.median(b["samples_per_s"] for b in base)
                            if base else None),
                   speedup_best=(max(r["samples_per_s"] for r in group) / max(b["samples_per_s"] for b in base)
                                 if base else None),  # None: no 1-rank run to compare with
                   speedup_range=[min(per_repeat), max(per_repeat)] if per_repeat else None,
                   oversubscribed=ranks > group[0].get("cores", os.cpu_count() or 1))
        rows.append(row)
    return rows


def plot(rows: list[dict], path: str) -> None:
    """Speed-up over one rank against ranks, one line per (net, scheme); a line, no plot, without matplotlib."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"no plot {path}: matplotlib is not installed (pip install matplotlib)")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    for net, scheme in sorted({(r["net"], r["scheme"]) for r in rows}):
        mine = sorted((r["ranks"], r["speedup"]) for r in rows
                      if (r["net"], r["scheme"]) == (net, scheme) and r["speedup"] is not None)
        ax.plot([n for n, _ in mine], [s for _, s in mine], marker="o", label=f"{net} {scheme}")
    most = max(r["ranks"] for r in rows)
    ax.plot([1, most], [1, most], color="grey", linestyle=":", label="linear")
    ax.set_xlabel("ranks")
    ax.set_ylabel("speed-up over 1 rank")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"plot {path}")


def print_table(rows: list[dict], collected: bool = False) -> None:
    """The table of ``rows``; ``collected``: read from a Slurm campaign's files (the hint for missing
    1-rank runs then names the batch job that makes them, else this script's option)."""
    missing = sorted({(r["net"], r["scheme"]) for r in rows if r["speedup"] is None})
    for r in rows:
        spread = f"({r['speedup_range'][0]:.2f}-{r['speedup_range'][1]:.2f})" if r["speedup_range"] else ""
        known = r["speedup"] is not None  # a 1-rank row exists
        speedup = f"x{r['speedup']:.2f}" if known else "x n/a"
        best = f"x{r['speedup_best']:.2f}" if known else "n/a"
        memory = f"{r['peak_rss_max'] / 2**20:>6.0f} MiB peak" if r.get("peak_rss_max") else "  n/a MiB peak"
        scheme = r["scheme"] + (" weak" if r.get("weak") else "")
        allocates = (f"  step allocates {' / '.join(f'{m:.1f}' for m in r['step_alloc_mib'])} MiB"
                     if r.get("step_alloc_mib") else "")
        print(f"{r['net']:<16} {scheme:<11} n={r['ranks']}{'*' if r['oversubscribed'] else ' '} "
              f"{r['samples_per_s']:>9.1f} samples/s  {speedup} {spread:<11} best {best}  "
              f"exposed comm {100 * r['exposed_comm_share']:>4.1f}%  "
              f"{r['bytes_per_step'] / 2**20:>7.2f} MiB/step  {memory}{allocates}  [{r['repeats']} runs]", flush=True)
    if any(r["oversubscribed"] for r in rows):  # (said only where a row is marked, as bench_peer does)
        print("* oversubscribed: more ranks than cores; correctness only, not speed")
    if missing:
        run = "sbatch --ntasks=1 slurm/bench.sbatch" if collected else "include 1 in --ranks"
        print("no 1-rank run for " + ", ".join(f"{net} {scheme}" for net, scheme in missing)
              + f": their speed-ups are n/a (run the baselines: {run})")


def collect(folder: str, expected_ranks: list[int], plot_path: str | None) -> int:
    """--collect: the table of the results in ``folder``; 1 when a task expected at ``expected_ranks``
    (a campaign's rank counts) left no result, naming each, or when there is no result at all."""
    runs = collected_runs(folder)
    if runs:
        rows = summarize(runs)
        print_table(rows, collected=True)
        if plot_path:
            plot(rows, plot_path)
    missing = missing_results(runs, expected_ranks)
    if missing:
        print(f"{folder}: no result from {len(missing)} task(s): {', '.join(missing)}: expected each task's "
              f"bench-NET-SCHEME-nN.json (its Slurm output, slurm-*.out, says why not)", file=sys.stderr)
        return 1
    if not runs:
        print(f"{folder}: no results (bench-*.json) yet: expected the benchmark jobs to have run", file=sys.stderr)
        return 1
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])  # its first paragraph
    parser.add_argument("--ranks", type=positive_int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--steps", type=positive_int, default=30, help="timed steps per run (the convnet: half)")
    parser.add_argument("--repeat", type=positive_int, default=3, help="runs per configuration (medians are reported)")
    parser.add_argument("--nets", nargs="+", default=list(NETS), choices=list(NETS))
    parser.add_argument("--schemes", nargs="+", default=["data", "feature", "hybrid"],
                        type=scheme_name, metavar="SCHEME",
                        help="data, feature, hybrid, auto (each layer's partition_dim chosen by the cost model, "
                             "singa-mpi plan --auto), auto-pipeline (the fastest pipeline plan --auto prices), pipeline (whole layers in stages of about equal predicted "
                             "time, one per rank), gpipe-M, 1f1b-M, zb-M or interleaved-M (that pipeline over M "
                             "micro-batches; interleaved: runs of layers dealt round robin over the ranks)")
    parser.add_argument("--weak", type=int, nargs="?", const=ONE_RANK_BATCH, default=0, metavar="ROWS",
                        help="weak scaling: every rank keeps the 1-rank batch, or ROWS rows (the global batch "
                             "grows with N)")
    parser.add_argument("--json")
    parser.add_argument("--worker", action="store_true",
                        help="run one --net/--scheme in the current MPI world (under mpiexec/srun)")
    parser.add_argument("--net", choices=list(NETS))
    parser.add_argument("--scheme", type=scheme_name)
    parser.add_argument("--dims", help="--worker: the cost model's choice (JSON): --scheme auto's partition_dim per "
                        "layer, a pipeline's stage per layer")
    parser.add_argument("--out", help="--worker: also write the JSON result here")
    parser.add_argument("--collect", help="print the table of the JSON results in this folder")
    parser.add_argument("--expect-ranks", type=positive_int, nargs="+", metavar="N",
                        help="--collect: every task of slurm/bench.sbatch must have a result at each of these "
                             "rank counts (a campaign's); the missing ones are named, exit 1")
    parser.add_argument("--plot", help="also draw the speed-ups into this PNG (needs matplotlib)")
    args = parser.parse_args()
    blas_threads_as_train()  # as `singa-mpi train` chooses (benchkit); before any numpy work
    if args.worker:  # measure() sets the job's own
        return worker(args)
    if args.collect:
        return collect(args.collect, args.expect_ranks or [], args.plot)
    runs: list[dict] = []
    failed: list[str] = []  # one line per run that ended without a result

    def report() -> None:
        rows = summarize(runs)
        if rows:
            print_table(rows)
        else:
            print("no run finished yet")
        if failed:
            print(f"{len(failed)} run(s) failed: " + "; ".join(failed), flush=True)
        if args.plot and rows:
            plot(rows, args.plot)
        if args.json:
            write_atomically(pathlib.Path(args.json), json.dumps({"summary": rows, "runs": runs, "failed": failed},
                                                                 indent=1, allow_nan=False) + "\n")  # strict JSON

    with report_if_cut_short(report):
        for net in args.nets:
            for scheme in args.schemes:
                for repeat in range(args.repeat):
                    for ranks in args.ranks:
                        refused = refusal(net, scheme, ranks, args.weak)
                        if refused:
                            print(f"  {net} {scheme} n={ranks}: refused by the planner ({refused})", flush=True)
                            continue
                        steps = args.steps if net == "mnist_mlp" else max(5, args.steps // 2)
                        try:
                            runs.append(launch(net, scheme, ranks, steps, args.weak))
                        except RunFailed as err:  # said in one line; the other runs go on
                            failed.append(str(err))
                            print(f"  {err}", flush=True)
                            continue
                        print(f"  measured {net} {scheme} n={ranks} ({repeat + 1}/{args.repeat}): "
                              f"{runs[-1]['samples_per_s']:,.1f} samples/s, {runs[-1]['step_ms']:.2f} ms/step",
                              flush=True)
                if runs:
                    print(f"{net} {scheme} done; the table so far:")
                    print_table(summarize(runs))
    report()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
