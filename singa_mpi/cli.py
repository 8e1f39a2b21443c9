"""The command line: parses ``singa-mpi COMMAND ...`` and calls the package.

Also ``python -m singa_mpi``.

Launch examples::

    singa-mpi train                                   # the default job (digits MLP)
    singa-mpi test                                    # its test phase on the run's newest checkpoint
    singa-mpi train conf/mnist_mlp.conf --workspace runs/mlp --seed 1
    singa-mpi check conf/cifar10_convnet.conf
    singa-mpi data digits --out data/digits
    singa-mpi examples conf                           # copy the example jobs out for editing
    mpiexec -n 2 python -m singa_mpi train conf/cifar10_hybrid.conf
    mpiexec -n 3 python -m singa_mpi train conf/cifar10_hybrid.conf --workers 3

Errors reach the user as one line on stderr and a non-zero exit code
(2 for a bad configuration, 3 for bad data, 5 for a NaN or infinity in training (see
``train --no-check-finite``), 6 out of memory); ``--debug`` (alias ``--traceback``) shows the stack
before that line, with the same exit code.
Bad option values are refused before anything runs, on one line.
"""
from __future__ import annotations

import argparse
import ast
import contextlib
import os
import pathlib
import re
import signal
import sys
import threading
import traceback
import warnings
from typing import Iterator

from singa_mpi import __version__, threads
from singa_mpi.errors import ConfigError, DataError, SingaError, one_line, out_of_memory, writing
from singa_mpi import option_values
from singa_mpi.option_values import ValueRule

# the example jobs ship inside the package (in a checkout, singa_mpi/conf links to the top-level conf/)
EXAMPLES = pathlib.Path(__file__).resolve().parent / "conf"
DEFAULT_JOB = "digits_mlp.conf"


def default_job_path() -> pathlib.Path:
    """The package's digits_mlp.conf (its data is prepared where the job asks for it)."""
    path = EXAMPLES / DEFAULT_JOB
    if not path.exists():
        raise ConfigError(f"no job given and {path} not found (a broken installation?): "
                          f"expected `singa-mpi train JOB.conf`")
    return path


WORKSPACE_DEFAULT = "the job's cluster.workspace, else workspace/JOB_NAME"  # what resolve_workspace picks


def resolve_workspace(cfg, override: str | None) -> str:
    """--workspace, else the job's cluster.workspace (a ConfigError at its file:line:col when a file
    is in the way of that folder), else workspace/JOB_NAME."""
    if override:
        return override
    if cfg.proto.cluster.workspace:
        from singa_mpi.workspace import file_in_the_way

        workspace = cfg.proto.cluster.workspace
        blocker = file_in_the_way(workspace)
        if blocker:
            raise ConfigError(f"{cfg.where('cluster', 'workspace')}: cluster.workspace = {workspace}: {blocker} is a "
                              f"file, not a folder: expected a folder for the run's checkpoints and logs (move "
                              f"that file, or name another folder here or with --workspace)")
        return workspace
    return os.path.join("workspace", cfg.proto.name or pathlib.Path(cfg.path).stem)


# ------------------------------------------------------------------ commands

def cmd_check(args) -> int:
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job

    cfg = load_job(args.job)
    if args.print_workspace:  # for batch scripts: where this job writes
        print(resolve_workspace(cfg, None))
        return 0
    summary = validate(cfg)
    resolve_workspace(cfg, None)  # a file where the workspace goes: train refuses it
    for warning in summary.warnings:
        print(f"warning: {warning}")
    steps = f"{summary.train_steps} steps" if summary.train_steps else "test only (no train_steps)"
    print(f"{cfg.path}: OK  job '{summary.name}'  {summary.algorithm}  {summary.updater}  {steps}")
    for phase in summary.phases:
        print(f"  {phase.phase}: {len(phase.layers)} layers, batch {phase.batch}")
        if args.verbose:
            for name, type_name, shape in phase.layers:
                print(f"    {name:<20} {type_name:<18} {shape}")
    print(f"  params: {len(summary.params)}  ({summary.num_weights:,} weights)")
    from singa_mpi import plugins

    for plugin in plugins.loaded():
        print(f"  {plugin.summary()}")
    if args.n is not None:
        from singa_mpi.program.job import job_programs
        from singa_mpi.topology import check_launch

        phases = [phase.phase for phase in summary.phases]
        if args.n == 1:  # one process trains the whole net serially, whatever the cluster asks for
            from singa_mpi.launcher.describe import one_process_notes

            per_group = 1
            for note in one_process_notes(cfg):
                print(note)
        else:
            per_group = check_launch(cfg.proto.cluster, args.n, cfg.where("cluster"))  # as a launch on N refuses
        cfg = resolve_auto(cfg, per_group)
        built = job_programs(cfg, per_group, phases)  # plans and proved programs, as a launch on N ranks has
        if args.check_memory:
            _check_memory_of_n_ranks(cfg, list(built.plans.values()), args.n)
        print(f"  plans on {per_group} worker(s){' per group' if per_group != args.n else ''}: "
              f"{', '.join(phases)} OK")
        _say_idle_pipeline(cfg, per_group, built.plans.get("train"))
    else:
        _say_idle_pipeline_of_cluster(cfg)
    return 0


def cmd_train(args) -> int:
    from singa_mpi.launcher import RunOptions, run_training

    job_path = args.job or default_job_path()
    options = RunOptions(seed=args.seed, steps=args.steps, stall_timeout=args.stall_timeout, resume=args.resume,
                         overwrite=args.overwrite, keep=args.keep, allow_partial=args.allow_partial)
    options.trace, options.profile = args.trace, args.profile
    options.allow_other_job = args.allow_other_job
    options.check_finite = args.check_finite
    options.check_memory = args.check_memory
    options.workers = args.workers
    options.debug = args.debug  # the communication table's bookkeeping rows too
    options.deterministic = args.deterministic
    return run_training(str(job_path), lambda cfg: resolve_workspace(cfg, args.workspace), options)


def cmd_run(args) -> int:
    """``run -n N [--elastic ...] JOB [train options]``: train under the supervisor (singa_mpi.supervisor)."""
    from singa_mpi.communication.hosts import HostListError, parse_hosts, read_hostfile, slurm_hosts
    from singa_mpi.communication.launchers import LauncherNotFound, find_launcher
    from singa_mpi.config.load import load_job
    from singa_mpi.launcher.start import refuse_launched_run
    from singa_mpi.supervisor import Policy, Supervisor, cannot_shrink, check_ranks, spelled_out

    refuse_launched_run(os.environ)  # first: every process an outer launcher started gets here
    healing = [option for option, given in (("--shrink", args.shrink), ("--min-ranks", args.min_ranks is not None),
                                            ("--max-restarts", args.max_restarts is not None),
                                            ("--no-emergency-checkpoint", not args.emergency)) if given]
    if healing and not args.elastic:  # they say how a run heals: without --elastic it would not, silently
        raise ConfigError(f"run: {' and '.join(healing)} without --elastic: expected --elastic with "
                          f"{'it' if len(healing) == 1 else 'them'} (without --elastic, run only launches and "
                          f"restarts nothing)")
    job_path = str(args.job or default_job_path())
    train_args, workspace = _taken_out(spelled_out(args.train_args, args.train_options), "--workspace")
    cfg = load_job(job_path)
    cluster = cfg.proto.cluster
    servers = (max(1, cluster.nserver_groups) * max(1, cluster.nservers_per_group)
               if cluster.server_worker_separate else 0)
    groups = max(1, cluster.nworker_groups)
    if args.ranks > 1:  # (one process trains the whole net, whatever the cluster asks, as train does)
        # refused before anything starts, in run's words: train, launched, said `mpiexec -n` or `--workers 0`
        check_ranks(cluster, args.ranks, servers, groups, f"run -n {args.ranks}: {cfg.where('cluster')}")
    unfit = cannot_shrink(cluster, args.ranks, servers, groups) if args.shrink else None
    if unfit:  # it would be found at the first death, its restart refused: say it before anything runs
        raise ConfigError(f"run: --shrink: {cfg.where('cluster')}: the survivors of a rank's death could not run "
                          f"this cluster ({unfit}): expected --elastic without --shrink (a restart on the same "
                          f"{args.ranks} ranks)")
    try:
        launcher = find_launcher(args.mpi)
    except LauncherNotFound as err:
        raise ConfigError(f"run: {err}") from None
    try:  # where the ranks run: named by the user (the launcher is told), else Slurm's allocation (it knows)
        named = parse_hosts(args.hosts) if args.hosts else read_hostfile(args.hostfile) if args.hostfile else None
    except HostListError as err:
        raise ConfigError(f"run: {err}") from None
    hosts = named or slurm_hosts() or []
    policy = Policy(args.ranks, args.elastic, args.min_ranks or 1,
                    Policy.max_restarts if args.max_restarts is None else args.max_restarts, args.shrink, servers,
                    groups, tuple(hosts), name_hosts=named is not None, emergency=args.emergency, mpi=args.mpi,
                    hostfile=args.hostfile)
    return Supervisor(job_path, resolve_workspace(cfg, workspace), train_args, policy, launcher).run()


def _taken_out(args: list[str], option: str) -> tuple[list[str], str | None]:
    """``args`` without ``option VALUE`` (or ``option=VALUE``), and the value (None when absent)."""
    kept, value, skip = [], None, False
    for index, arg in enumerate(args):
        if skip:
            skip = False
        elif arg == option and index + 1 < len(args):
            value, skip = args[index + 1], True
        elif arg.startswith(option + "="):
            value = arg.split("=", 1)[1]
        else:
            kept.append(arg)
    return kept, value


def cmd_test(args) -> int:
    from singa_mpi.test_command import run_test

    return run_test(str(args.job or default_job_path()), lambda cfg: resolve_workspace(cfg, args.workspace),
                    checkpoints=args.checkpoint, workers=args.workers, check_memory=args.check_memory)


def _check_memory_of_n_ranks(cfg, plans: list, n: int) -> None:
    """`check -n N`: a job that would not fit one rank alone on a machine like this one is refused; one
    that fits a rank alone but not N ranks on this machine (as `run -n N` starts them) is warned of, as
    its N ranks may be spread over nodes (train checks each node's own share before any communication)."""
    from singa_mpi.cost.memory import check_memory

    try:
        near = check_memory(cfg, plans, n)
    except ConfigError as err:
        check_memory(cfg, plans, 1)  # raises where even one rank alone would not fit
        near = f"{err} (if all {n} ranks share this machine; across nodes, train checks each node's share)"
    if near:
        print(f"warning: {near}")


def cmd_plan(args) -> int:
    from singa_mpi.algorithms import make_algorithm
    from singa_mpi.checks.job import validate
    from singa_mpi.config.load import load_job, phases_of, wants_deterministic
    from singa_mpi.checks.phase import check_phase
    from singa_mpi.planner import plan, render
    from singa_mpi.planner.syncs import ALLREDUCE, DETERMINISTIC, DETERMINISTIC_SHARED

    check_plan_options(args)
    cfg = load_job(args.job)
    validate(cfg)
    if args.phase not in phases_of(cfg):  # validate checked only the phases the job runs
        check_phase(cfg, args.phase, {}, [])
    if wants_deterministic(cfg.proto):  # the mode has one way to sync: its own
        args.sync = DETERMINISTIC if args.sync == ALLREDUCE else DETERMINISTIC_SHARED
    check_nodes(cfg, args)
    if args.auto:
        return auto_partition(cfg, plan_workers(cfg, args.n), args)
    cfg = resolve_auto(cfg, plan_workers(cfg, args.n), args.sync)
    algorithm = make_algorithm(cfg.proto.train_one_batch)
    the_plan = plan(cfg, plan_workers(cfg, args.n), phase=args.phase, method=args.sync, algorithm=algorithm)
    if args.phase == "train":  # on stderr: stdout is the plan (JSON, dot) a program may read
        _say_idle_pipeline(cfg, plan_workers(cfg, args.n), the_plan, sys.stderr)
    renderers = {"json": render.to_json, "dot": render.to_dot, "program": render.to_program,
                 "text": lambda p, sync, algorithm: render.to_text(p, sync, full=args.full, algorithm=algorithm)}
    if args.cost:  # the prediction instead of the plan (at 1,024 ranks the plan is 100,000 lines)
        from singa_mpi.cost.beside import cost_lines

        with _priced(cfg, "--cost"):
            text = "\n".join(cost_lines(the_plan, args.sync, args.recalibrate, args.nodes, algorithm))
    else:
        text = renderers[args.format](the_plan, args.sync, algorithm=algorithm)
    if args.format == "text" and not args.cost:
        text = "\n".join(render.roles_lines(cfg, the_plan) + [text])
    if args.output and args.format == "dot" and pathlib.Path(args.output).suffix.lower() not in DOT_TEXT_SUFFIXES:
        return _render_dot(text, args.output)
    if args.output:
        write_output(args.output, text + "\n", "the plan")
        print(f"wrote {args.output}")
    else:
        print(text)
    return 0


def _say_idle_pipeline(cfg, workers: int, train_plan, stream=None) -> None:
    """The note when the job's pipeline does nothing on ``workers`` workers (as a training run says it)."""
    from singa_mpi.program.schedules import idle_pipeline_note

    note = idle_pipeline_note(cfg, workers, train_plan)
    if note:
        print(note, file=stream or sys.stdout)


def _say_idle_pipeline_of_cluster(cfg) -> None:
    """`check` without -n: the note of :func:`_say_idle_pipeline` on the workers per group the job's
    cluster fixes (cluster.nworkers_per_group); nothing when it fixes none (a launch's count is unknown)."""
    from singa_mpi.algorithms import make_algorithm
    from singa_mpi.cost.auto import resolve_auto_layers
    from singa_mpi.planner import plan
    from singa_mpi.program.schedules import idle_pipeline_note

    cluster = cfg.proto.cluster
    if not cluster.HasField("nworkers_per_group") or idle_pipeline_note(cfg, 1) is None:
        return  # no worker count to judge by, or no pipeline (one worker always notes a pipeline)
    workers = cluster.nworkers_per_group
    if workers < 2:
        _say_idle_pipeline(cfg, workers, None)
        return
    try:  # only the stages are wanted: a plan that cannot be made is check -n's to say, as before
        cfg, _ = resolve_auto_layers(cfg, workers)
        train_plan = plan(cfg, workers, algorithm=make_algorithm(cfg.proto.train_one_batch))
    except ConfigError:
        return
    _say_idle_pipeline(cfg, workers, train_plan)


# what Graphviz draws a plan into (by -o's suffix); the text formats are written as they are
PICTURE_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg", ".gif", ".ps", ".eps")
# where --format dot writes its text as it is (Graphviz's own names for it, and plain text): any
# other -o name is a picture Graphviz draws
DOT_TEXT_SUFFIXES = (".dot", ".gv", ".txt")


def check_plan_options(args) -> None:
    """ConfigError for ``plan`` options that do not go together, before the job is read: each was
    ignored without a word (a --memory-limit without --auto, --recalibrate or --nodes without --cost or
    --auto, a --format beside --cost or --auto, which print their own text) or wrote text under a
    picture's name (``-o plan.png`` without --format dot)."""
    if args.memory_limit is not None and not args.auto:
        raise ConfigError(f"--memory-limit {args.memory_limit}: expected --auto beside it (the limit applies to "
                          f"the partitionings --auto prices; --cost and a plain plan take none)")
    made = "--cost" if args.cost else "--auto" if args.auto else ""
    for given, option in ((args.recalibrate, "--recalibrate"), (args.nodes != 1, f"--nodes {args.nodes}")):
        if given and not made:
            raise ConfigError(f"{option}: expected --cost or --auto beside it (it applies to the cost model's "
                              f"prediction; a plain plan takes none)")
    if made and args.format != "text":
        raise ConfigError(f"--format {args.format} with {made}: expected --format text ({made} prints its own "
                          f"table{'; -o writes the chosen job' if args.auto else ''})")
    suffix = pathlib.Path(args.output or "").suffix.lower()
    if suffix in PICTURE_SUFFIXES and args.format != "dot":
        what, draw = (made, "") if made else (f"--format {args.format}", "--format dot to draw the plan, or ")
        raise ConfigError(f"-o {args.output}: {what} writes text, not a {suffix} picture: expected {draw}a text "
                          f"file name")


def write_output(path: str, text: str, what: str) -> None:
    """Write an output file of the command line (its folder made); a file system that refuses is one
    line, exit code 3 (:func:`singa_mpi.errors.writing`)."""
    with writing(path, what):
        pathlib.Path(path).write_text(text)


def resolve_auto(cfg, nworkers: int, method: str = "shared_memory"):
    """The job with its `partition_dim: auto` layers chosen by the cost model (a line says what)."""
    from singa_mpi.cost.auto import resolve_auto_layers

    cfg, line = resolve_auto_layers(cfg, nworkers, method)
    if line:
        print(line)
    return cfg


@contextlib.contextmanager
def _priced(cfg, option: str):
    """The cost model's refusal of a job's training algorithm (CD's passes are not timed) as the line
    naming the job's train_one_batch."""
    from singa_mpi.algorithms import algorithm_name
    from singa_mpi.cost.model import NotPriced

    try:
        yield
    except NotPriced as err:
        name = algorithm_name(cfg.proto.train_one_batch)
        raise ConfigError(f"{cfg.where('train_one_batch')}: train_one_batch = {name}: plan {option}: "
                          f"{err.reason()}: expected a BP or BPTT job (kBP, kBPTT)") from None


def auto_partition(cfg, nworkers: int, args) -> int:
    """``plan --auto``: choose every layer's partition_dim by predicted step time; -o writes the job."""
    from singa_mpi.cost.auto import auto_report

    with _priced(cfg, "--auto"):
        lines, job_text = auto_report(cfg, nworkers, args.sync, memory_limit=args.memory_limit * 2**20
                                      if args.memory_limit else None, recalibrate=args.recalibrate, nodes=args.nodes)
    print("\n".join(lines))
    if args.output:
        write_output(args.output, job_text, "the job")
        print(f"wrote {args.output}")
    return 0


def cmd_calibrate(args) -> int:
    """Under mpiexec: measure the communicator's latency and bandwidth for ``plan --cost``."""
    from singa_mpi.communication import mpi as comm_module
    from singa_mpi.cost.calibrate import calibrate

    world = comm_module.world()
    if world.size < 2:
        raise ConfigError("calibrate measures messages between ranks: launch it with mpiexec -n 2 (or more)")
    for line in calibrate(world, comm_module.library()):
        print(line, flush=True)
    world.root_value(None, "calibrate")  # the ranks off rank 0's node wait asleep while it calibrates there
    return 0


def check_nodes(cfg, args) -> None:
    """ConfigError for ``plan --nodes N`` over more nodes than the ranks it plans: the model priced one
    rank per node, as if the extra nodes were not there."""
    workers = plan_workers(cfg, args.n)
    if args.nodes <= workers:
        return
    lead, most = (f"--nodes {args.nodes} with -n {args.n}", "-n") if args.n is not None else (
        f"{cfg.where('cluster', 'nworkers_per_group')}: --nodes {args.nodes} with cluster.nworkers_per_group = "
        f"{workers}", "the workers per group (or -n N)")
    raise ConfigError(f"{lead}: more nodes than the {workers} rank(s) to fill: expected --nodes at most "
                      f"{most} (each node holds at least one rank)")


def plan_workers(cfg, n: int | None) -> int:
    """-n N when given (it overrides cluster.nworkers_per_group, as `train --workers N` does), else
    the job's cluster.nworkers_per_group."""
    if n is not None:
        return n
    cluster = cfg.proto.cluster
    if cluster.HasField("nworkers_per_group"):
        return cluster.nworkers_per_group
    raise ConfigError(f"{cfg.path}: no worker count: expected -n N (the job sets no cluster.nworkers_per_group)")


def _render_dot(text: str, output: str) -> int:
    """Draw with Graphviz's `dot` into PNG/SVG/PDF (by the file extension)."""
    import shutil
    import subprocess

    dot = shutil.which("dot")
    if dot is None:
        dot_path = str(pathlib.Path(output).with_suffix(".dot"))
        write_output(dot_path, text + "\n", "the plan")
        print(f"warning: Graphviz `dot` not found: wrote {dot_path} instead of {output} (install Graphviz: "
              f"apt-get install graphviz, brew install graphviz, or conda install graphviz)", file=sys.stderr)
        return 0
    fmt = pathlib.Path(output).suffix.lstrip(".") or "png"
    with writing(output, "the drawing of the plan"):
        pass  # its folder made, for Graphviz to write into
    done = subprocess.run([dot, f"-T{fmt}", "-o", output], input=text.encode(), capture_output=True, timeout=120,
                          check=False)
    if done.returncode != 0:
        said = next(iter(done.stderr.decode(errors="replace").strip().splitlines()), f"exit code {done.returncode}")
        if said.startswith("Format:"):  # Graphviz knows no such format: the -o name's suffix is wrong
            raise ConfigError(f"-o {output}: {said}")
        raise DataError(f"{output}: Graphviz `dot` could not write it: {said}")
    print(f"wrote {output}")
    return 0


def cmd_ckpt(args) -> int:
    from singa_mpi.checkpoints import tools as ckpt_tools

    if args.action == "inspect":
        if len(args.files) > 1 or args.out or args.step is not None or args.job:
            extra = args.files[1:] + (["--out"] if args.out else []) + (["--step"] if args.step is not None else [])
            extra += ["--job"] if args.job else []
            raise ConfigError(f"ckpt inspect: {' '.join(extra)}: expected one checkpoint and no convert options "
                              f"(inspect each file on its own)")
        print(ckpt_tools.inspect(args.files[0]))
        return 0
    if not args.out:
        raise ConfigError("ckpt convert: --out FILE.h5 is required")
    if os.path.lexists(args.out) and not args.overwrite:  # a run's own checkpoint, say
        raise ConfigError(f"ckpt convert: --out {args.out} exists: expected a new file (--overwrite replaces it)")
    if len(set(map(os.path.realpath, args.files))) < len(args.files):
        raise ConfigError(f"ckpt convert: {' '.join(args.files)}: a file given twice: expected each worker's file once")
    shapes = None
    if args.job:  # the job that wrote the files: the whole shape of each param, hence the axis of its parts
        from singa_mpi.checks.job import validate
        from singa_mpi.config.load import load_job

        shapes = dict(validate(load_job(args.job)).params)
    print(ckpt_tools.convert_singa(args.files, args.out, step=args.step, shapes=shapes, job=args.job))
    return 0


def cmd_examples(args) -> int:
    """Copy the example jobs that ship with the package (and the plugins beside them) into DIR, for editing."""
    import shutil

    out = pathlib.Path(args.dir)
    for conf in sorted(EXAMPLES.glob("*.conf")) + sorted(EXAMPLES.glob("*.py")):
        target = out / conf.name
        if target.exists() and not args.overwrite:
            print(f"kept {target} (it exists; --overwrite replaces it)")
            continue
        with writing(str(target), "an example job"):
            shutil.copyfile(conf, target)
        print(f"wrote {target}")
    return 0


def cmd_data(args) -> int:
    from singa_mpi.data import convert

    _refuse_collisions(args)
    _refuse_replacing(args)
    if args.source == "synthetic":
        from singa_mpi.data.synthetic import write_synthetic

        paths = write_synthetic(args.like, count=args.count, classes=args.classes or _classes_of(args.like),
                                seed=args.seed, overwrite=args.overwrite)
        if not paths:
            print(_nothing_written(args.like))
    elif args.source == "digits":
        paths = convert.convert_digits(args.out, backend=args.backend, test_fraction=args.test_fraction,
                                       seed=args.seed)
    elif args.source == "mnist":
        paths = convert.convert_mnist(args.images, args.labels, args.out, args.backend)
    elif args.source == "cifar10":
        paths = convert.convert_cifar10(args.batches, args.out, args.backend, mean_out=args.mean)
    elif args.source == "text":
        return _data_text(args)
    else:
        paths = convert.convert_csv(args.csv, args.out, args.backend, has_label=not args.no_label,
                                    separator=args.separator)
    for path in paths if isinstance(paths, (list, tuple)) else [paths]:
        print(f"wrote {path}")
    return 0


def _nothing_written(job: str) -> str:
    """Why `data synthetic --like JOB` wrote nothing: the job names no data files, synthetic makes none
    of those missing (a plugin's reader: how to make it), or they all exist."""
    from singa_mpi.config.load import load_job
    from singa_mpi.data.prepare import reader_files, store_files

    cfg = load_job(job)
    files = [(layer.name, f"store_conf.{field}", path, "") for layer in cfg.proto.neuralnet.layer
             for field, path in store_files(layer)]
    files += [(layer.name, f"{conf}.{field}", path, todo) for layer in cfg.proto.neuralnet.layer
              for conf, field, path, todo in reader_files(layer, job)]
    if not files:
        return f"nothing to write: {job} names no data files"
    missing = [file for file in files if not os.path.exists(file[2])]
    if missing:
        name, field, path, todo = missing[0]
        return f"nothing written: data synthetic does not make {path} ({field} of layer '{name}'): {todo}"
    return "nothing to write: the job's data files exist (use --overwrite to replace them)"


def _classes_of(job: str) -> int:
    """The label range of a job's synthetic data: the classes its softmax loss scores, else 10."""
    from singa_mpi.checks.job import loss_classes
    from singa_mpi.config.load import load_job

    return loss_classes(load_job(job)) or 10


def _refuse_collisions(args) -> None:
    """ConfigError when an output of `data` is one of its inputs or another of its outputs: the
    conversion would replace its own source, or one file would overwrite the other."""
    inputs = [getattr(args, name) for name in ("images", "labels", "csv") if getattr(args, name, None)]
    inputs += list(getattr(args, "batches", None) or [])
    outputs = [(f"--{name}", getattr(args, name)) for name in ("out", "mean") if getattr(args, name, None)]
    seen: dict[str, str] = {}
    for option, path in outputs:
        real = os.path.realpath(path)
        if real in map(os.path.realpath, inputs):
            raise ConfigError(f"data {args.source}: {option} {path} is also an input: expected another file "
                              f"(the conversion would replace its own source)")
        if real in seen:
            raise ConfigError(f"data {args.source}: {option} {path} is also {seen[real]}: expected two files")
        seen[real] = option


def _refuse_replacing(args) -> None:
    """ConfigError when a file a converter would write exists and --overwrite is not given (a converted
    store, or the digits, text and vocabulary in --out, were replaced without a word)."""
    from singa_mpi.data.convert import EXTENSIONS
    from singa_mpi.data.text import INPUT_FILE, VOCAB_FILE

    if args.overwrite or args.source == "synthetic" or not args.out:  # synthetic leaves existing files alone
        return
    outputs = [("--out", args.out)] + ([("--mean", args.mean)] if args.mean else [])
    if args.source in ("digits", "text"):  # --out is their folder
        names = [INPUT_FILE, VOCAB_FILE] if args.source == "text" else \
            [f"{split}{EXTENSIONS[args.backend]}" for split in ("train", "test")]
        outputs = [("", os.path.join(args.out, name)) for name in names]
    found = [f"{option} {path}".strip() for option, path in outputs if os.path.lexists(path)]
    if found:
        one = len(found) == 1
        raise ConfigError(f"data {args.source}: {' and '.join(found)} {'exists' if one else 'exist'}: expected "
                          f"--overwrite to replace {'it' if one else 'them'}, or another --out")


def _data_text(args) -> int:
    """char-rnn's input.txt and vocab.txt (the standard library's source without FILES)."""
    from singa_mpi.data.text import write_text_corpus

    text_path, vocab_path = write_text_corpus(args.out, args.files, args.max_bytes)
    for path in (text_path, vocab_path):
        print(f"wrote {path}")
    symbols = os.path.getsize(vocab_path)
    print(f"{os.path.getsize(text_path)} bytes of text, {symbols} symbols: onehot_conf.vocab_size and the "
          f"output layer's num_output must be at least {symbols}")
    return 0


def cmd_plot(args) -> int:
    from singa_mpi import plot

    output = args.output or plot.default_output(args.workspaces, args.profile)
    if args.profile:
        if len(args.workspaces) != 1:
            raise ConfigError(f"plot --profile: {len(args.workspaces)} workspaces: expected one")
        plot.plot_profile(args.workspaces[0], output, args.debug)
    else:
        plot.plot_metrics(args.workspaces, output)
    print(f"wrote {output}")
    return 0


def cmd_draw(args) -> int:
    from singa_mpi import pictures

    if args.what == "filters":
        output = pictures.draw_filters(args.checkpoint, args.output, args.param, args.shape, args.max)
    else:
        output = pictures.draw_reconstructions(args.job, args.checkpoint,
                                               lambda cfg: resolve_workspace(cfg, args.workspace), args.output,
                                               args.n, args.phase, args.shape)
    print(f"wrote {output}")
    return 0


def cmd_sample(args) -> int:
    """The seed text and the sampled characters on stdout (bytes as they are, then a newline); notes on stderr."""
    from singa_mpi.sampling import sample_job

    with threads.blas_threads(work=0):  # one row per step: a second BLAS thread only waits
        text = sample_job(args.job, lambda cfg: resolve_workspace(cfg, args.workspace), args.checkpoint,
                          args.seed_text, args.n, args.temperature, args.seed,
                          log=lambda line: print(line, file=sys.stderr, flush=True))
    sys.stdout.flush()
    out = getattr(sys.stdout, "buffer", None)
    if out is None:  # a text-only stream (some embedders): the bytes as latin-1, one character each
        sys.stdout.write(text.decode("latin-1") + "\n")
    else:
        out.write(text + b"\n")
        out.flush()
    return 0


# ------------------------------------------------------------------ parser

MEMORY_HELP = ("do not refuse a job predicted to need more memory per rank than a rank can have (the cgroup's "
               "limit, else physical memory, over the ranks on the node; docs/troubleshooting.md)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="singa-mpi", description="Train, test, check and plan SINGA 0.x jobs on MPI ranks "
                                                    "(`singa-mpi COMMAND -h`: a command's options).")
    parser.add_argument("--version", action="version", version=f"singa-mpi {__version__}")
    parser.add_argument("--debug", "--traceback", dest="debug", action="store_true",
                        help="show the Python traceback on errors (--traceback is the older name)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")  # errors say COMMAND, not command

    p = sub.add_parser("train", help="train a job (default: conf/digits_mlp.conf)")
    p.add_argument("job", nargs="?", help="job configuration (text-format JobProto)")
    p.add_argument("--workspace", help=f"output folder (default: {WORKSPACE_DEFAULT})")
    p.add_argument("--seed", type=job_seed, help="overrides the job's seed (a 64-bit integer)")
    p.add_argument("--steps", type=non_negative_int,
                   help="overrides train_steps (0: write the initial params as step 0 and stop)")
    p.add_argument("--workers", type=positive_int, metavar="N",
                   help="overrides cluster.nworkers_per_group: partition the job over N workers "
                        "(launch N MPI ranks)")
    p.add_argument("--stall-timeout", type=positive_seconds, default=None, metavar="SECONDS",
                   help="MPI runs: abort when a step makes no progress for this many seconds")
    p.add_argument("--resume", action="store_true",
                   help="continue from the newest complete checkpoint in the workspace (any rank count)")
    p.add_argument("--overwrite", action="store_true",
                   help="start afresh in a workspace that holds another run: its checkpoints and metrics.jsonl "
                        "move to WORKSPACE/previous-<time>/")
    p.add_argument("--keep", type=positive_int, default=None, metavar="K", help="keep only the K newest checkpoints")
    p.add_argument("--allow-partial", action="store_true",
                   help="when loading a checkpoint, keep the initial values of params it lacks")
    p.add_argument("--allow-other-job", action="store_true",
                   help="--resume from a checkpoint another job wrote (its job identity differs: other params "
                        "or layers); params are taken by name")
    p.add_argument("--trace", metavar="FILE", type=writable_file,
                   help="write every rank's timeline (layers, communication, trainer phases) to FILE as "
                        "Chrome-trace JSON: open it in https://ui.perfetto.dev or chrome://tracing")
    p.add_argument("--profile", action="store_true",
                   help="print per-layer compute and communication per step at the end "
                        "(always written to WORKSPACE/profile.json)")
    p.add_argument("--deterministic", action="store_true",
                   help="bitwise-identical training on any number of workers (the job's deterministic setting, "
                        "on; docs/deterministic.md)")
    p.add_argument("--no-check-finite", dest="check_finite", action="store_false",
                   help="do not stop at the first NaN or infinity (by default every step checks the input "
                        "batches, the loss and other metrics, and the gradients before the update; the first "
                        "non-finite value ends the run with exit code 5, naming step, phase and layer, "
                        "and no checkpoint of it is written)")
    p.add_argument("--no-check-memory", dest="check_memory", action="store_false",
                   help=MEMORY_HELP)
    _plugin_option(p)
    p.set_defaults(func=cmd_train)
    train_options = [option for action in p._actions for option in action.option_strings]  # run reads them

    p = sub.add_parser("run", help="train under MPI from one command, restarting on the survivors when a rank "
                                   "dies (--elastic)")
    p.add_argument("-n", "--ranks", type=positive_int, required=True, metavar="N", help="MPI ranks to launch")
    p.add_argument("--elastic", action="store_true",
                   help="when a rank dies, relaunch and resume from the newest checkpoint (docs/self-healing.md)")
    p.add_argument("--shrink", action="store_true",
                   help="--elastic: relaunch on the surviving ranks only (default: as many ranks as before)")
    p.add_argument("--min-ranks", type=positive_int, default=None, metavar="M",
                   help="--elastic: stop rather than run on fewer than M ranks (default: 1)")
    p.add_argument("--max-restarts", type=non_negative_int, default=None, metavar="R",
                   help="--elastic: stop after R restarts (default: 3)")
    p.add_argument("--no-emergency-checkpoint", dest="emergency", action="store_false",
                   help="--elastic: when a rank dies, do not ask the survivors to save what they hold (by default "
                        "they do, and the restart loses only the step in flight where together they hold every "
                        "param and updater state; MPICH only)")
    p.add_argument("--mpi", choices=("mpich", "openmpi"), default=None,
                   help="the MPI whose launcher starts the ranks (default: $SINGA_MPI_FLAVOR, else MPICH if present)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--hosts", metavar="HOST:SLOTS,...",
                       help="start the ranks on these hosts, filling each one's slots in order; --elastic leaves "
                            "a host that dies out of the relaunch (default: the launcher's choice; in a Slurm "
                            "allocation its nodes)")
    where.add_argument("--hostfile", metavar="FILE",
                       help="as --hosts, from a file: lines 'HOST', 'HOST:SLOTS' or 'HOST slots=SLOTS'")
    p.add_argument("job", nargs="?", help="job configuration (default: conf/digits_mlp.conf)")
    p.add_argument("train_args", nargs=argparse.REMAINDER, metavar="...",
                   help="options of `singa-mpi train` (--workspace, --steps, --stall-timeout, ...)")
    p.set_defaults(func=cmd_run, train_options=train_options)

    p = sub.add_parser("test", help="run the test phase on a trained model (default: conf/digits_mlp.conf's, "
                                    "as train trains it)")
    p.add_argument("job", nargs="?", help="the job file that trained it (default: conf/digits_mlp.conf, train's)")
    p.add_argument("--workspace", help=f"the run's folder (default: {WORKSPACE_DEFAULT})")
    p.add_argument("--checkpoint", action="append",
                   help="checkpoint file(s) to load (default: the newest in the workspace)")
    p.add_argument("--workers", type=positive_int, metavar="N", help="overrides cluster.nworkers_per_group")
    p.add_argument("--no-check-memory", dest="check_memory", action="store_false", help=MEMORY_HELP)
    _plugin_option(p)
    p.set_defaults(func=cmd_test)

    p = sub.add_parser("check", help="validate a job configuration (no data, no MPI)")
    p.add_argument("job", help="job configuration (text-format JobProto) to check")
    p.add_argument("-v", "--verbose", action="store_true", help="list layers with output shapes")
    p.add_argument("--print-workspace", action="store_true", help="only print the job's workspace folder")
    p.add_argument("-n", "--ranks", "--workers", dest="n", type=positive_int, metavar="N",
                   help="also check a launch on N MPI ranks as train there checks it (a framework's server ranks "
                        "count among them, as in run -n N), partition every phase over its workers and prove its "
                        "schedule safe (no MPI; --workers is the older name)")
    p.add_argument("--no-check-memory", dest="check_memory", action="store_false",
                   help="-n N: " + MEMORY_HELP + " (here: the N ranks on this machine)")
    _plugin_option(p)
    p.set_defaults(func=cmd_check)

    p = sub.add_parser("plan", help="show how a job is partitioned over N workers (no MPI needed)")
    p.add_argument("job", help="job configuration (text-format JobProto) to partition")
    p.add_argument("-n", "--workers", dest="n", type=positive_int,
                   help="workers per group to plan for: the MPI ranks, but for a framework's server ranks, which "
                        "come on top (default: the job's cluster.nworkers_per_group; a job without it needs -n)")
    p.add_argument("--phase", default="train", choices=["train", "test", "val"],
                   help="the phase whose net to partition (default: train)")
    p.add_argument("--format", default="text", choices=["text", "json", "dot", "program"],
                   help="program: each rank's step as the ordered actions the runtime executes")
    p.add_argument("--full", action="store_true", help="an unrolled net: list every time step's copies "
                                                        "(default: time step 0's, with their count)")
    p.add_argument("--sync", default="shared_memory", choices=["shared_memory", "allreduce"],
                   help="how params every worker holds are synchronised: node-shared memory (all workers on "
                        "one node, the default there) or bucketed Allreduce (several nodes, or SINGA_MPI_SHM=0)")
    p.add_argument("-o", "--output", type=writable_file,
                   help="write to FILE (dot: written as text to .dot/.gv/.txt; .png/.svg/.pdf are drawn with Graphviz)")
    p.add_argument("--cost", action="store_true",
                   help="print the predicted ms per layer (forward, backward, communication) and per step instead")
    p.add_argument("--recalibrate", action="store_true", help="--cost: time the kernels afresh (else cached)")
    p.add_argument("--nodes", type=positive_int, default=1,
                   help="--cost/--auto: nodes the ranks fill in equal blocks; messages within a node take its "
                        "calibrated rates, across nodes the network's (calibrate under mpiexec on several nodes)")
    p.add_argument("--auto", action="store_true",
                   help="choose every layer's partition_dim by predicted step time (-o FILE: write the job so)")
    p.add_argument("--memory-limit", type=mebibytes, metavar="MIB",
                   help="--auto: skip partitionings that need more than MIB MiB on a rank")
    _plugin_option(p)
    p.set_defaults(func=cmd_plan)

    p = sub.add_parser("calibrate", help="under mpiexec: measure the communicator's latency and bandwidth "
                                         "for plan --cost")
    p.set_defaults(func=cmd_calibrate)

    p = sub.add_parser("ckpt", help="inspect or convert checkpoints")
    p.add_argument("action", choices=["inspect", "convert"],
                   help="inspect: print a checkpoint's step, params and shapes and check its checksums; convert: "
                        "join SINGA 0.x BlobProtos files into one HDF5 checkpoint (--out)")
    p.add_argument("files", nargs="+", help="inspect: a checkpoint; convert: SINGA 0.x BlobProtos files")
    p.add_argument("--out", type=writable_file, help="convert: the HDF5 checkpoint to write")
    p.add_argument("--step", type=non_negative_int, help="convert: the step to record (default: from the file name)")
    p.add_argument("--overwrite", action="store_true", help="convert: replace --out if it exists")
    p.add_argument("--job", help="convert: the SINGA job (JOB.conf) that wrote the files: it says how a "
                                 "feature-partitioned param's parts join")
    p.set_defaults(func=cmd_ckpt)

    p = sub.add_parser("plot", help="draw runs' metrics.jsonl (or a run's profile) into a PNG (needs matplotlib)")
    p.add_argument("workspaces", nargs="+", metavar="WORKSPACE", help="workspaces of training runs (overlaid)")
    p.add_argument("-o", "--output", type=writable_file, help="the PNG to write (default: WORKSPACE/metrics.png, "
                                          "WORKSPACE/profile.png, or ./metrics.png for several runs)")
    p.add_argument("--profile", action="store_true",
                   help="per-layer time and communication per step from WORKSPACE/profile.json instead")
    p.set_defaults(func=cmd_plot)

    p = sub.add_parser("draw", help="draw an RBM's or autoencoder's filters or reconstructions from a checkpoint "
                                    "into a PNG (needs matplotlib)")
    draw = p.add_subparsers(dest="what", required=True, metavar="WHAT")  # errors say WHAT, not what
    d = draw.add_parser("filters", help="one tile per hidden unit: the rows of a 2-D weight as images")
    d.add_argument("checkpoint", metavar="CKPT", help="an HDF5 checkpoint (WORKSPACE/checkpoint/step<N>.h5)")
    d.add_argument("--param", help="the weight to draw (default: the checkpoint's first 2-D param)")
    d.add_argument("--max", type=positive_int, default=100, metavar="N", help="draw at most N filters (default 100)")
    d.add_argument("--shape", metavar="HxW", help="image height x width (default: square)")
    d.add_argument("-o", "--output", type=writable_file,
                   help="the PNG to write (default: CKPT_STEM_PARAM_filters.png beside CKPT)")
    d.set_defaults(func=cmd_draw)
    d = draw.add_parser("reconstructions", help="N inputs of one batch over the model's reconstructions")
    d.add_argument("job", metavar="JOB", help="the job that wrote CKPT (kCD with an RBM, or kBP with kEuclideanLoss)")
    d.add_argument("checkpoint", metavar="CKPT", help="an HDF5 checkpoint of that job")
    d.add_argument("-n", type=positive_int, default=10, help="how many inputs (default 10)")
    d.add_argument("--phase", default="test", choices=["train", "test", "val"], help="whose batch (default test)")
    d.add_argument("--shape", metavar="HxW", help="image height x width (default: square)")
    d.add_argument("--workspace", help=f"also look for data files there (default: {WORKSPACE_DEFAULT})")
    d.add_argument("-o", "--output", type=writable_file,
                   help="the PNG to write (default: CKPT_STEM_reconstructions.png beside CKPT)")
    _plugin_option(d)
    d.set_defaults(func=cmd_draw)

    p = sub.add_parser("sample", help="generate text from a trained char-rnn job (kCharRNN, kOneHot, kGRU)")
    p.add_argument("job", metavar="JOB", help="the char-rnn job that was trained (e.g. conf/char_rnn.conf)")
    p.add_argument("--checkpoint", metavar="CKPT", help="the checkpoint to load (default: the newest good one "
                                                        "in the job's workspace)")
    p.add_argument("--seed-text", metavar="TEXT", help="fed in first, then printed before the sample "
                                                       "(default: a newline)")
    p.add_argument("-n", type=non_negative_int, default=500, metavar="CHARS",
                   help="how many characters (the vocabulary's symbols: bytes) to sample after the seed text, "
                        "which is printed first and not counted (default 500; not ranks, as -n is elsewhere)")
    p.add_argument("--temperature", type=positive_number, default=1.0,
                   help="divides the logits: below 1 likelier characters, above 1 more varied (default 1)")
    p.add_argument("--seed", type=data_seed, default=0, help="the sampling's random seed (default 0: the same text "
                                                       "each time)")
    p.add_argument("--workspace", help=f"where the job's checkpoints are (default: {WORKSPACE_DEFAULT})")
    _plugin_option(p)
    p.set_defaults(func=cmd_sample)

    p = sub.add_parser("examples", help="copy the example jobs (digits, MNIST, CIFAR-10) into a folder")
    p.add_argument("dir", nargs="?", default="conf", type=writable_folder,
                   help="the folder to copy them into (default: ./conf)")
    p.add_argument("--overwrite", action="store_true", help="replace files that exist")
    p.set_defaults(func=cmd_examples)

    p = sub.add_parser("data", help="convert data sets into stores")
    p.__class__ = _IntermixedParser  # add_parser builds the parent's class; FILES may follow the options
    p.add_argument("source", choices=["digits", "mnist", "cifar10", "csv", "synthetic", "text"],
                   help="digits: scikit-learn's bundled digits (nothing to download); mnist: IDX files; cifar10: "
                        "binary batches; csv: label,v1,v2,... lines; synthetic: random stores for a job's input "
                        "layers (--like); text: a char-rnn corpus and its vocabulary")
    p.add_argument("files", nargs="*", metavar="FILES",
                   help="text: files to concatenate (default: the Python standard library's own source)")
    p.add_argument("--out", type=writable_path, help="output store (folder for digits)")
    p.add_argument("--backend", default="hdf5", choices=["hdf5", "kvfile", "textfile", "shard"],
                   help="store format (shard: SINGA 0.1's DataShard folder, for kShardData)")
    p.add_argument("--images", help="mnist: IDX image file (.gz ok)")
    p.add_argument("--labels", help="mnist: IDX label file (.gz ok)")
    p.add_argument("--batches", nargs="+", help="cifar10: binary batch files")
    p.add_argument("--mean", type=writable_file, help="cifar10: also write the per-pixel mean to this kvfile "
                                  "(with --backend shard: SINGA 0.1's image_mean.bin)")
    p.add_argument("--csv", help="csv: input file with label,v1,v2,... lines")
    p.add_argument("--no-label", action="store_true", help="csv: lines carry no label column")
    p.add_argument("--separator", type=one_character, default=",",
                   help='csv: the character between values (default ","; "" for any whitespace)')
    p.add_argument("--test-fraction", type=float, default=0.2, help="digits: held-out share")
    p.add_argument("--seed", type=data_seed, default=0, help="digits: split seed; synthetic: data seed")
    p.add_argument("--like", help="synthetic: write random stores at the paths of this job's input layers")
    p.add_argument("--count", type=positive_int, default=1000, help="synthetic: records per store")
    p.add_argument("--classes", type=positive_int, default=None,
                   help="synthetic: label range (default: the classes the job's softmax loss scores, else 10)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace existing files (synthetic: else they are left alone; the converters: else refused)")
    p.add_argument("--max-bytes", type=positive_int, default=2_000_000,
                   help="text: keep the first N bytes (default 2,000,000)")
    p.set_defaults(func=cmd_data)
    _debug_after_the_command_too(parser)
    _described(parser)
    return parser


def _described(parser: argparse.ArgumentParser) -> None:
    """Each command's ``-h`` opens with what the command does, as the list in ``singa-mpi -h`` says it
    (add_parser's help= goes to that list only: `singa-mpi calibrate -h` showed its usage alone)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for choice in action._choices_actions:
                child = action.choices[choice.dest]
                child.description = child.description or f"{choice.help[:1].upper()}{choice.help[1:]}."
                _described(child)


def _debug_after_the_command_too(parser: argparse.ArgumentParser) -> None:
    """``singa-mpi check --debug JOB`` as well as ``singa-mpi --debug check JOB``: every command's parser
    takes the flag too (unset there, it leaves the top level's value alone)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                child.add_argument("--debug", "--traceback", dest="debug", action="store_true",
                                   default=argparse.SUPPRESS, help="show the Python traceback on errors")
                _debug_after_the_command_too(child)


def _plugin_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plugin", action="append", metavar="MODULE_OR_FILE",
                        help="import a plugin (a module name, or a .py file or package folder) that registers "
                             "user layers, algorithms, updaters, ... before the job is read; repeatable")


class _Parser(argparse.ArgumentParser):
    """argparse with its errors on one line, like every other error of singa-mpi (``-h`` shows the usage);
    subcommands' parsers are of this class too (argparse builds them as their parent's)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}{_closest_choice(message)} (see {self.prog} -h)\n")

    def parse_args(self, args=None, namespace=None):  # type: ignore[override]
        """As argparse's, but what no parser took is named with the help of the command it followed."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = getattr(parsed, "command", None)
            early = [arg for arg in extras if arg.startswith("--") and len(arg.split("=", 1)[0]) > 2 and any(
                option.startswith(arg.split("=", 1)[0]) for option in getattr(parsed, "train_options", ()))]
            if command == "run" and early:  # `run -n 2 --workspace W JOB`: train's options go after the job
                self.exit(2, f"{self.prog} run: error: {early[0]} is an option of `singa-mpi train`: expected it after "
                             f"the job (singa-mpi run -n N [run's options] JOB {early[0]} ...) (see {self.prog} run "
                             f"-h)\n")
            self.exit(2, f"{self.prog}: error: unrecognized arguments: {' '.join(extras)} (see "
                         f"{self.prog} {command + ' ' if command else ''}-h)\n")
        return parsed


# argparse's words for a value outside an argument's choices (a command, --phase, --format, ...)
_INVALID_CHOICE = re.compile(r"invalid choice: (?P<bad>'.*?') \(choose from (?P<choices>.*)\)$")


def _closest_choice(message: str) -> str:
    """`` (did you mean 'train'?)`` when ``message`` refuses a choice one of the valid ones resembles."""
    refused = _INVALID_CHOICE.search(message)
    if refused is None:
        return ""
    try:
        bad, choices = ast.literal_eval(refused["bad"]), ast.literal_eval(f"[{refused['choices']}]")
    except (SyntaxError, ValueError):
        return ""
    return option_values.did_you_mean(bad, choices)


class _IntermixedParser(_Parser):
    """A subcommand that takes its positionals after options too (``data text --out DIR a.txt``):
    argparse's plain parse matches every positional in one run, leaving FILES empty at ``text``."""

    _inside = False
    _REQUIRED = "the following arguments are required: "

    def error(self, message: str):
        """As :class:`_Parser`'s, without the optional positionals argparse's intermixed parse names as
        required when a required one is missing (`singa-mpi data` said "required: source, FILES")."""
        if message.startswith(self._REQUIRED):
            optional = {action.metavar or action.dest for action in self._actions
                        if not action.option_strings and action.nargs in ("?", "*")}
            names = [name for name in message[len(self._REQUIRED):].split(", ") if name not in optional]
            message = self._REQUIRED + ", ".join(names) if names else message
        super().error(message)

    def parse_known_args(self, args=None, namespace=None):
        if self._inside:  # the stdlib's intermixed parse calls back here for each of its two passes
            return super().parse_known_args(args, namespace)
        self._inside = True
        try:
            return self.parse_known_intermixed_args(args, namespace)
        finally:
            self._inside = False


# ------------------------------------------------------------------ option values
# argparse `type=` functions: a bad value is refused on one line before anything runs
# (argparse adds "argument --steps: " in front of the message).

def _option_value(text: str, rule: ValueRule) -> int | float:
    """``text`` as a number that ``rule`` (:mod:`singa_mpi.option_values`: the API's rules too) takes."""
    try:
        value = int(text) if rule.whole else float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected {'an integer' if rule.whole else rule.expected}") \
            from None
    if not rule.holds(value):
        raise argparse.ArgumentTypeError(f"{value if rule.whole else text}: expected {rule.expected}")
    return value


def one_character(text: str) -> str:
    if len(text) > 1:  # numpy's reader splits on one character
        raise argparse.ArgumentTypeError(f"{text!r}: expected one character (or '' for any whitespace)")
    return text


def positive_int(text: str) -> int:
    return int(_option_value(text, option_values.COUNT))


def mebibytes(text: str) -> int:
    """A size in MiB, as a whole number: ``4GB`` or ``0`` is refused saying what was expected."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected a whole number of MiB, at least 1, without a unit "
                                         f"(4096 for 4 GiB)")
    return value


def non_negative_int(text: str) -> int:
    return int(_option_value(text, option_values.NON_NEGATIVE))


def job_seed(text: str) -> int:
    """A job's seed, stored in the job's int64 ``seed`` field."""
    return int(_option_value(text, option_values.JOB_SEED))


def data_seed(text: str) -> int:
    """A seed for numpy's generator of data or samples, which takes no negative seed."""
    return int(_option_value(text, option_values.DATA_SEED))


def positive_number(text: str) -> float:
    return float(_option_value(text, option_values.POSITIVE_NUMBER))


def positive_seconds(text: str) -> float:
    return float(_option_value(text, option_values.POSITIVE_SECONDS))


def writable_file(text: str) -> str:
    """A file the command will write (:func:`singa_mpi.option_values.writable_file`)."""
    return _writable(option_values.writable_file, text)


def writable_folder(text: str) -> str:
    """A folder the command will write into (:func:`singa_mpi.option_values.writable_folder`)."""
    return _writable(option_values.writable_folder, text)


def writable_path(text: str) -> str:
    """A file or folder the command will write (:func:`singa_mpi.option_values.writable_path`)."""
    return _writable(option_values.writable_path, text)


def _writable(rule, text: str) -> str:
    try:
        return rule(text)
    except option_values.BadPath as err:
        raise argparse.ArgumentTypeError(f"{text or repr(text)}: {err}") from None


def _check_data_args(args) -> None:
    required = {"mnist": ("images", "labels", "out"), "cifar10": ("batches", "out"), "csv": ("csv", "out"),
                "digits": ("out",), "synthetic": ("like",), "text": ("out",)}
    for name in required.get(getattr(args, "source", ""), ()):
        if not getattr(args, name):
            raise ConfigError(f"data {args.source}: --{name} is required")
    _check_data_out(args)
    if getattr(args, "files", None) and args.source != "text":
        raise ConfigError(f"data {args.source}: unexpected arguments {' '.join(args.files)}: expected options only "
                          f"(file arguments are for `data text`)")
    mine = DATA_OPTIONS.get(getattr(args, "source", ""), ())
    for name, default in DATA_DEFAULTS.items():
        if name not in mine and getattr(args, name, default) != default:  # given, and silently unused
            owners = [source for source, names in DATA_OPTIONS.items() if name in names]
            owners = f"data {', '.join(owners[:-1])} and {owners[-1]}" if len(owners) > 1 else f"data {owners[0]}"
            takes = ", ".join(f"--{n.replace('_', '-')}" for n in (*mine, "overwrite"))
            raise ConfigError(f"data {args.source}: --{name.replace('_', '-')} is an option of {owners}: expected "
                              f"options of data {args.source} ({takes})")


def _check_data_out(args) -> None:
    """ConfigError (exit 2, as for ``--out FILE/sub``) when --out is a file where the source writes a folder,
    or a folder where it writes a file: `data digits --out FILE` was found only while writing (exit 3)."""
    if not getattr(args, "out", None) or args.source == "synthetic":
        return
    folder = args.source in ("digits", "text") or args.backend == "shard"
    what = {"digits": "the digits' train and test stores", "text": "the text and its vocabulary"}.get(
        args.source, "the DataShard" if folder else "the store")
    try:
        writable_folder(args.out) if folder else writable_file(args.out)
    except argparse.ArgumentTypeError as err:
        raise ConfigError(f"data {args.source}: argument --out: {err} for {what}") from None


# the options each source of `data` reads (besides --overwrite), and their defaults: one given to another
# source is refused (`data mnist --mean FILE` wrote no mean file, without a word)
DATA_OPTIONS = {"mnist": ("images", "labels", "out", "backend"), "cifar10": ("batches", "out", "mean", "backend"),
                "csv": ("csv", "out", "backend", "no_label", "separator"),
                "digits": ("out", "backend", "test_fraction", "seed"),
                "synthetic": ("like", "count", "classes", "seed"), "text": ("out", "max_bytes")}
DATA_DEFAULTS = {"out": None, "backend": "hdf5", "images": None, "labels": None, "batches": None, "mean": None,
                 "csv": None, "no_label": False, "separator": ",", "test_fraction": 0.2, "seed": 0, "like": None,
                 "count": 1000, "classes": None, "max_bytes": 2_000_000}


# commands that use no MPI: under mpiexec or srun each rank runs the same one, and rank 0 alone speaks
SPOKEN_BY_RANK_0 = ("check", "plan")
# commands that write files and use no MPI: under a launcher rank 0 alone does the work (the others
# would write the same files at once, and say so once each)
DONE_BY_RANK_0 = ("data", "examples", "ckpt", "plot", "draw", "sample")
# commands with stop signals of their own: a run's (checkpoint, exit 75) and the supervisor's
OWN_STOP_SIGNALS = ("train", "test", "run", "calibrate")


def main(argv: list[str] | None = None) -> int:
    off_root = threads.world_rank(os.environ) > 0
    with _silenced(off_root, stdout=False):  # a bad argument is every rank's: rank 0 says it, once
        args = build_parser().parse_args(argv)
    if args.command in DONE_BY_RANK_0 and off_root:
        return 0
    with _silenced(off_root and args.command in SPOKEN_BY_RANK_0), \
            _interrupted_by(signal.SIGTERM, args.command not in OWN_STOP_SIGNALS):
        return _main(args)  # (silenced: the same exit code as rank 0's, its lines once)


@contextlib.contextmanager
def _silenced(silent: bool, stdout: bool = True) -> Iterator[None]:
    """With ``silent``, stderr (and ``stdout``) go nowhere for the block."""
    if not silent:
        yield
        return
    with open(os.devnull, "w") as nowhere, contextlib.ExitStack() as stack:
        stack.enter_context(contextlib.redirect_stderr(nowhere))
        if stdout:
            stack.enter_context(contextlib.redirect_stdout(nowhere))
        yield


@contextlib.contextmanager
def _interrupted_by(signum: int, wanted: bool = True) -> Iterator[None]:
    """``signum`` ends a command as Ctrl-C does: the files it was writing are removed (each is written
    under a temporary name first), one line, exit 128 + signum (the default action left them behind).
    Not ``wanted``: the command handles its stop signals itself."""
    def interrupt(number, frame):
        error = KeyboardInterrupt(f"{signal.Signals(number).name}: nothing written")
        error.exit_code = 128 + number  # type: ignore[attr-defined]
        raise error

    if not wanted or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signum, interrupt)
    try:
        yield
    finally:
        signal.signal(signum, previous)


def _main(args: argparse.Namespace) -> int:
    # the process's warning filters are the caller's (Python's defaults show every UserWarning, the only
    # kind singa_mpi gives): a program or a test suite calling main keeps what it ignores ignored
    warnings.formatwarning = lambda msg, cat, *a, **k: f"warning: {msg}\n"
    if getattr(args, "plugin", None):
        from singa_mpi import plugins

        plugins.use(args.plugin)  # imported with the job, on every rank, before validation
    try:
        if args.command != "data":  # train and test choose BLAS threads once they know the job (launcher)
            return args.func(args)
        _check_data_args(args)
        with threads.blas_threads(warn=lambda line: print(f"warning: {line}", file=sys.stderr, flush=True)):
            return args.func(args)
    except (SingaError, MemoryError) as err:
        if args.debug:  # the stack as well; the exit code stays the error's own (1 is for bugs)
            traceback.print_exc()
            sys.stderr.flush()
        if isinstance(err, MemoryError):  # a job too big for the machine is no bug: one line, exit 6
            err = out_of_memory(err)
        print(f"singa-mpi: error: {one_line(str(err))}", file=sys.stderr, flush=True)
        return err.exit_code
    except KeyboardInterrupt as err:  # before training starts, or a second Ctrl-C during it
        print(f"singa-mpi: interrupted{f' ({err})' if str(err) else ''}", file=sys.stderr, flush=True)
        return getattr(err, "exit_code", 130)
