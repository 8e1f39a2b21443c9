"""What a rank reads before any communication, so that a missing or damaged file is one voted line
rather than every rank's abort at step 0: the input layers' files and first batches, the job's
checkpoint_path files (``train``) or the checkpoints to test (``test``).  Each rank reads by itself."""
from __future__ import annotations

import os
import warnings
from typing import Callable, NamedTuple, Sequence

from singa_mpi import nonfinite
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checkpoints.tools import Shapes, read_initial
from singa_mpi.config.load import JobConfig, layers_for_phase
from singa_mpi.cost.memory import SWITCH as MEMORY_SWITCH, check_memory
from singa_mpi.errors import ConfigError, DataError
from singa_mpi.launcher import vote
from singa_mpi.launcher.describe import Launch
from singa_mpi.launcher.options import Request, RunOptions
from singa_mpi.proto import job_pb2
from singa_mpi.workspace import clear_dead_writes, probe_file_folder


class Start(NamedTuple):
    """What a rank read before any communication."""

    initial: checkpoint.Checkpoint | None  # the parameters the run starts from (see read_before_start)
    first_batches: tuple[tuple[str, str], ...]  # the facts of the input layers' first batches (vote.first_batch)


def read_before_start(launch: Launch, request: Request, is_root: bool,
                      log: Callable[[str], None] | None) -> Start:
    """Check the input files of every phase (``log``: this rank's notes, None to say nothing) and the
    first batches; return them, and the parameters the run starts from: with --resume the workspace's
    newest good checkpoint, checked to be this job's (:func:`read_resumed`), else the job's
    checkpoint_path files (None without them), or for ``test`` the checkpoints to test."""
    batches = _check_and_read(launch, request, is_root, log)
    return Start(_initial(launch, request, is_root, log), tuple(batches))


def _check_and_read(launch: Launch, request: Request, is_root: bool,
                    log: Callable[[str], None] | None) -> list[tuple[str, str]]:
    """The checks of :func:`read_before_start` up to the first batches, whose facts it returns."""
    if request.options.check_memory:  # first: a batch too big would fail reading its first rows
        near = check_memory(launch.cfg, plans_to_fit(launch), launch.node_ranks, request.options.said(MEMORY_SWITCH),
                            trains=request.trains)
        if near:
            warnings.warn(near)  # recorded: rank 0 says it once (said_once)
    check_inputs(launch.cfg, launch.workspace, list(launch.phases), log)
    if request.trains and request.options.trace:
        check_trace_path(launch.cfg, launch.workspace, request.options.trace)
        if is_root:  # the one that writes it
            probe_file_folder(request.options.trace, "--trace", trace_companions(launch, request.options.trace))
    # what step 0 would meet (under MPI voted, before any communication), and a label any later step would
    return check_first_batches(launch.cfg, launch.workspace, list(launch.phases),
                               request.options.check_finite, request.options.said(nonfinite.SWITCH))


def _initial(launch: Launch, request: Request, is_root: bool,
             log: Callable[[str], None] | None) -> checkpoint.Checkpoint | None:
    """The parameters the run starts from (see :func:`read_before_start`)."""
    if request.trains and resumes(launch.workspace, request.options.resume):
        if is_root:  # before the checkpoint is judged: a refused resume leaves no dead writer's file either
            clear_dead_writes(launch.workspace)
        return fitting(launch, read_resumed(launch, request.options, log), True, request.options.allow_partial)
    if request.trains:
        return fitting(launch, read_checkpoint_paths(launch.cfg, launch.workspace, request.options.resume,
                                                     launch.summary.params), False, request.options.allow_partial)
    return fitting(launch, checkpoints_to_test(launch.workspace, list(request.checkpoints), is_root,
                                               request.options), False, None)


def plans_to_fit(launch: Launch) -> list:
    """The plans whose memory :func:`check_memory` predicts: the launch's, else (one process, the whole
    net) each phase's on one worker, as placed by no job's location (none where the planner refuses)."""
    from singa_mpi.cost.auto import placement_free
    from singa_mpi.planner import partition

    if launch.plans:
        return list(launch.plans.values())
    try:
        return [partition(placement_free(launch.cfg), 1, phase) for phase in launch.phases]
    except ConfigError:
        return []


def fitting(launch: Launch, ckpt: checkpoint.Checkpoint | None, full: bool,
            allow_partial: bool | None) -> checkpoint.Checkpoint | None:
    """``ckpt``, once every param of the job fits it as loading it will require (``full``: --resume, also
    the params it lacks; ``allow_partial``: None for `test`): checked by every rank alike in phase 1, so
    another net's checkpoint (taken with --allow-other-job, or given to `test`) is one voted line from
    rank 0 (exit 3), not the first failing rank's abort when it loads it."""
    from singa_mpi.checkpoints.snapshot import misfits

    if ckpt is not None:
        written = [param for layer in launch.cfg.proto.neuralnet.layer for param in layer.param]
        without_init = {param.name for param in written if not param.share_from and not param.HasField("init")}
        order = {name: k for k, name in enumerate(dict.fromkeys(param.name for param in written))}
        params = sorted(launch.summary.params, key=lambda item: (order.get(item[0], len(order)), item[0]))
        misfits(ckpt, dict(params), without_init, full, allow_partial)  # the first misfit in the job's order
    return ckpt


def check_inputs(cfg: JobConfig, workspace: str, phases: list[str], log: Callable[[str], None] | None) -> None:
    """Every file the input layers of ``phases`` read exists (as written, else under the workspace);
    scikit-learn's digits are prepared wherever a job asks for them (``log`` says so).  A missing
    file is a DataError naming the command that makes it."""
    from singa_mpi.data import prepare
    from singa_mpi.layers.input import resolve_path

    seen = set()
    for phase in phases:
        for index, layer in layers_for_phase(cfg.proto, phase):
            for field, path in prepare.store_files(layer):
                found = None if path in seen else resolve_path(path, workspace)
                problem = prepare.folder_problem(found, field, layer.store_conf) if found is not None else None
                if problem:
                    raise DataError(f"{_naming(cfg, index, layer.name, 'store_conf', field)} {path}: {problem}")
                if path in seen or found is not None:
                    continue
                seen.add(path)
                if field == "path" and prepare.is_bundled_digits(path, layer.store_conf):
                    if log is not None:
                        log(f"preparing scikit-learn's digits in {os.path.dirname(path)}/ (first use)")
                    prepare.prepare_digits(path, layer.store_conf)
                    continue
                todo = prepare.how_to_make(path, field, layer.store_conf, cfg.path)
                raise _missing(_naming(cfg, index, layer.name, "store_conf", field), path, workspace, todo)
            for conf, field, path, todo in prepare.reader_files(layer, cfg.path):  # DataShards, char-rnn text
                if path not in seen and resolve_path(path, workspace) is None:
                    raise _missing(_naming(cfg, index, layer.name, conf, field), path, workspace, todo)


def trace_companions(launch: Launch, trace: str) -> list[str]:
    """The names of the files written beside --trace's: the root's temporary copy of it and, under MPI,
    the last rank's part (the longest rank number)."""
    from singa_mpi.durable import temporary
    from singa_mpi.timeline_parts import part_path

    names = [temporary(trace)]
    if launch.topo is not None:
        names.append(part_path(trace, launch.topo.world_size - 1))
    return [os.path.basename(name) for name in names]


def check_trace_path(cfg: JobConfig, workspace: str, trace: str) -> None:
    """--trace's file is none the run reads or writes: the timeline, written at the end, would replace
    the job file, a store, a checkpoint or the workspace's record of the run (a ConfigError naming which)."""
    real = os.path.realpath(trace)
    if real.startswith(os.path.realpath(checkpoint.checkpoint_dir(workspace)) + os.sep):
        raise ConfigError(f"--trace {trace}: is in the workspace's checkpoint folder: expected a file the run "
                          f"neither reads nor writes")
    for path, what in _run_files(cfg, workspace):
        if os.path.realpath(path) == real:
            raise ConfigError(f"--trace {trace}: is {what}: expected a file the run neither reads nor writes")


def _run_files(cfg: JobConfig, workspace: str) -> list[tuple[str, str]]:
    """(path, what it is) of the files a run reads or writes; a relative store path both as written and
    under the workspace (where the input layers look for it)."""
    from singa_mpi.data import prepare
    from singa_mpi.layers.output import output_files
    from singa_mpi.profiling import FILE as PROFILE
    from singa_mpi.trainer import STOP_NOTE
    from singa_mpi.workspace import JOB_FILE

    files = [(cfg.path, "the job file")] if cfg.path else []
    for layer in cfg.proto.neuralnet.layer:
        for field, path in prepare.store_files(layer):
            what = f"layer '{layer.name}' store_conf.{field}"
            files += [(path, what), (os.path.join(workspace, path), what)]
    files += [(path, "a checkpoint_path file") for path in cfg.proto.checkpoint_path]
    files += [(path, "an output layer's file") for path in output_files(cfg.proto, workspace)]
    names = ("metrics.jsonl", PROFILE, "communication.json", STOP_NOTE, JOB_FILE)
    return files + [(os.path.join(workspace, name), f"the run's {name}") for name in names]


def check_first_batches(cfg: JobConfig, workspace: str, phases: list[str], check_finite: bool = True,
                        switch: str = nonfinite.SWITCH) -> list[tuple[str, str]]:
    """What the first step of each phase would find wrong with the data, found before any communication
    (every rank runs this in phase 1, so that data that every rank reads alike fails as one voted line):
    every input layer opens its data and reads the first global batch (all ranks' rows: the store
    decodes only these), label sources (kLabel) take their labels, and every loss layer looks at them.
    ``check_finite`` (not --no-check-finite): a store small enough for its first read to decode it whole
    is looked at whole, and a NaN or an infinity in it is refused, naming the record and how the caller
    turns the check off (``switch``: the command's flag, or fit's argument).
    The layers are throw-away serial instances without parameters; a DataError says what the first
    step would have said.  Returns the facts of what each input layer read (:func:`vote.first_batch`)."""
    import numpy as np

    from singa_mpi.data.stores import BackendMismatch, ShapeMismatch
    from singa_mpi.layers.base import LayerContext
    from singa_mpi.net import global_batch_size, instantiate, phase_nodes

    vocab_checked: set[tuple[str, int, str]] = set()  # (phase, layer in the file, source): once for its copies
    batches: list[tuple[str, str]] = []
    for phase in phases:
        nodes = phase_nodes(cfg, phase)
        batch, train = global_batch_size(cfg, nodes), phase == "train"
        built = instantiate(cfg, nodes, lambda node: LayerContext(global_batch=batch, seed=cfg.proto.seed,
                                                                   workspace=workspace, phase=phase))
        by_name = {node.name: layer for node, layer, _ in built}
        read: dict[str, np.ndarray] = {}  # the output of each layer that read (input layers, label sources)
        try:
            for node, layer, kinds in built:
                srcs = [by_name[name] for name in node.conf.srclayers if name in by_name]
                if layer.is_input and not srcs:
                    if hasattr(layer, "open"):
                        try:
                            layer.open(cache=False)
                        except (ShapeMismatch, BackendMismatch) as err:  # the job's field, where the file has it
                            field = "shape" if isinstance(err, ShapeMismatch) else "backend"
                            raise DataError(f"{cfg.layer_where(node.index, 'store_conf', field)}: {err}") from None
                        if check_finite and hasattr(layer, "refuse_nonfinite"):
                            layer.refuse_nonfinite(nonfinite.advice(nonfinite.INPUT, switch))
                        rereads = _rereads(cfg, phase, node.name, layer, batch)
                        if rereads:
                            warnings.warn(rereads)  # recorded: rank 0 says it once (said_once)
                    read[node.name] = layer.forward([], train)
                    batches.append(vote.first_batch(node.name, phase, _first_rows(read[node.name], layer.aux)))
                elif getattr(layer, "provides_labels", False) and srcs and all(s.name in read for s in srcs):
                    read[node.name] = layer.forward([s.aux if k == "aux" else read[s.name]
                                                     for s, k in zip(srcs, kinds)], train)
                elif layer.is_loss and "aux" in kinds[:len(srcs)]:
                    labels = srcs[kinds.index("aux")]
                    if labels.name in read and (phase, node.index, "") not in vocab_checked:  # the whole text
                        vocab_checked.add((phase, node.index, ""))
                        _check_text_labels(cfg, built, node, srcs[kinds.index("data")], labels)
                    if labels.name in read and labels.aux is not None:  # scores of the right shape, and these labels
                        scores = np.zeros((len(labels.aux),) + srcs[kinds.index("data")].out_shape, np.float32)
                        try:
                            layer.forward([labels.aux if k == "aux" else scores for k in kinds[:len(srcs)]], train)
                        except DataError as err:
                            _check_every_label(layer, _reader(labels, by_name), arrays_only=True)  # y's row
                            raise DataError(f"{err}, in the first batch{_read_from(labels, by_name)}") from None
                        _check_every_label(layer, labels)
                elif node.conf.type in _VOCABULARIES and srcs and srcs[0].name in read:
                    if (phase, node.index, srcs[0].name) not in vocab_checked:
                        vocab_checked.add((phase, node.index, srcs[0].name))
                        _check_vocabulary(cfg, node, srcs[0], read[srcs[0].name])
        finally:
            for layer in by_name.values():
                store = getattr(layer, "store", None)
                if store is not None:
                    store.close()
    return batches


def _first_rows(data, labels) -> list[tuple[str, object]]:
    """An input layer's first batch as (name, array) pairs: its data and its labels (if any)."""
    return [("data", data)] + ([("labels", labels)] if labels is not None else [])


def _rereads(cfg: JobConfig, phase: str, name: str, layer, batch: int) -> str | None:
    """The line to say when a test (or validation) pass reads more whole batches than its store holds:
    the store wraps around (as SINGA's), so some records would count twice or more in its metrics and
    the pass cost more for nothing (test_steps 2,000,000,000 on a few hundred records).  Up to one pass,
    whose last batch may wrap in part (SINGA's examples: 10,000 records, 100 batches of 100), nothing."""
    field = {"test": "test_steps", "val": "validate_steps"}.get(phase)
    store = getattr(layer, "store", None)
    if field is None or store is None or not len(store):
        return None
    steps, records = getattr(cfg.proto, field), len(store)
    one_pass = -(-records // batch)
    if steps <= one_pass:
        return None
    what = "a test" if phase == "test" else "a validation"
    return (f"{cfg.where(field)}: {field} = {steps}: {what} reads {steps:,} batches of {batch} = {steps * batch:,} "
            f"records, and layer '{name}' reads {store.path}, which holds {records:,}: it reads them over again (the "
            f"store wraps around); expected {field} <= {one_pass}, one pass")


# the layers that take integer ids, and the conf holding their vocab_size
_VOCABULARIES = {job_pb2.kOneHot: "onehot_conf", job_pb2.kEmbedding: "embedding_conf"}


def _check_vocabulary(cfg: JobConfig, node, src, first_batch) -> None:
    """Every id ``src`` gives (a kCharRNN's whole text, else its first batch) is inside the vocab_size of
    ``node`` (kOneHot, kEmbedding): a smaller one ends the step that meets the first id beyond it."""
    from singa_mpi.net import describe

    text = getattr(src, "ids", None)  # kCharRNN: the text as indices into its vocabulary file
    ids = first_batch if text is None else text
    if ids.size == 0:
        return
    conf = _VOCABULARIES[node.conf.type]
    vocab, top = getattr(node.conf, conf).vocab_size, int(ids.max())
    if top < vocab:
        return
    where = (f"the text {src.conf.char_rnn_conf.path} (read by layer '{src.name}', its vocabulary "
             f"{src.conf.char_rnn_conf.vocab_path})" if text is not None else f"the first batch of layer '{src.name}'")
    raise ConfigError(f"{cfg.layer_where(node.index, conf, 'vocab_size')}: {describe(cfg, node)}: "
                      f"{conf}.vocab_size = {vocab}: expected at least {top + 1}: {where} holds ids up to {top}")


def _check_text_labels(cfg: JobConfig, built, node, scores, labels) -> None:
    """A loss (``node`` of ``built``) whose labels are ids of a kCharRNN's text (kRNNLabel) scores at least
    as many classes as the text holds ids (its first batch alone was checked): the field to raise is the
    scoring layer's."""
    from singa_mpi.net import describe

    layers = {n.name: layer for n, layer, _ in built}
    loss = layers[node.name]
    reader, classes = labels, getattr(loss, "classes", None)
    while getattr(reader, "ids", None) is None and reader.conf.srclayers and reader.conf.srclayers[0] in layers:
        reader = layers[reader.conf.srclayers[0]]
    text = getattr(reader, "ids", None)
    if text is None or not classes or text.size == 0 or int(text.max()) < classes:
        return
    top = int(text.max())
    why = (f"layer '{loss.name}' scores its {classes} outputs as classes of the labels of layer '{labels.name}', "
           f"and the text {reader.conf.char_rnn_conf.path} (its vocabulary {reader.conf.char_rnn_conf.vocab_path}) "
           f"holds ids up to {top}")
    scorer = next(n for n, _, _ in built if n.name == scores.name)
    if scorer.conf.type == job_pb2.kInnerProduct:
        raise ConfigError(f"{cfg.layer_where(scorer.index, 'innerproduct_conf', 'num_output')}: "
                          f"{describe(cfg, scorer)}: innerproduct_conf.num_output = {classes}: expected at least "
                          f"{top + 1}: {why}")
    raise ConfigError(f"{cfg.layer_where(node.index, 'srclayers', 0)}: {describe(cfg, node)}: srclayers[0] = "
                      f"'{scores.name}' ({classes} outputs): expected a layer of at least {top + 1}: {why}")


def _check_every_label(loss, labels, arrays_only: bool = False) -> None:
    """Every label of the store that ``labels`` (an input layer) reads, where that is cheap: one out of
    the loss's classes ends some later step, naming neither the file nor the record.  ``arrays_only``:
    only a script's arrays (their row of y, where the first batch's message named the store's digest)."""
    from singa_mpi.data.memory import is_memory_path
    from singa_mpi.data.stores import label_text
    from singa_mpi.layers.loss import first_label_outside

    store, classes = getattr(labels, "store", None), getattr(loss, "classes", None)
    if arrays_only and (store is None or not is_memory_path(store.path)):
        return
    if store is None or not classes:
        return
    for start, chunk in store.label_chunks():  # a bounded number at a time, whatever the store's size
        at = first_label_outside(chunk, classes)
        if at is not None:
            row = start + at
            where = f"layer '{labels.name}': row {row} of its y" if is_memory_path(store.path) else \
                f"{store.path}: record {row}"  # a script's arrays, or a file
            raise DataError(f"{where}: label {label_text(chunk[at])}: expected a class index in 0..{classes - 1} "
                            f"(layer '{loss.name}' scores {classes} classes)")


def _reader(layer, layers: dict):
    """The input layer that ``layer``'s labels come from (itself, or the reader below a label source)."""
    while getattr(layer, "store", None) is None and layer.conf.srclayers and layer.conf.srclayers[0] in layers:
        layer = layers[layer.conf.srclayers[0]]  # a label source (kLabel) takes them from its input layer
    return layer


def _read_from(layer, layers: dict) -> str:
    """" of layer 'data' read from PATH": the input layer (and its store) that ``layer``'s labels come from."""
    layer = _reader(layer, layers)
    store = getattr(layer, "store", None)
    return f" of layer '{layer.name}'" + (f" read from {store.path}" if store is not None else "")


def _naming(cfg: JobConfig, index: int, name: str, conf: str, field: str) -> str:
    """FILE:LINE:COL: layer 'NAME': CONF.FIELD, of the field that names a file (``index``: the layer's
    in the file; ``name``: the layer's, an unrolled copy's own)."""
    return f"{cfg.layer_where(index, conf, field)}: layer '{name}': {conf}.{field}"


def _missing(naming: str, path: str, workspace: str, todo: str) -> DataError:
    """One line: where the job names the file, which layer, where it was looked for, how to make it."""
    where = "" if workspace in ("", ".") else f" or in the workspace {workspace}"
    return DataError(f"{naming} {path}: no such file (looked in the current folder {os.getcwd()}{where}): {todo}")


def resumes(workspace: str, resume: bool) -> bool:
    """--resume continues from the workspace's own checkpoints: it has some (else the job's
    checkpoint_path files, if any, start it)."""
    return resume and bool(checkpoint.listed(workspace))


def read_resumed(launch: Launch, options: RunOptions,
                 log: Callable[[str], None] | None) -> checkpoint.Checkpoint | None:
    """--resume's checkpoint: the workspace's newest good one, read and checked to be this job's by
    every rank in phase 1.  Every one damaged, or another job's, is then one voted line (exit 3 or
    2) before any rank loads it: checked on the root alone after the vote, another rank loading
    another net's params ended the job first, with its own error (a param's shape, exit 3)."""
    ckpt = checkpoint.newest_good(launch.workspace)
    if ckpt is None:  # removed since listed: nothing to check, the run notes it starts at step 0
        return None
    _check_job_identity(launch, ckpt, options, log)
    _updater_state_for(launch, ckpt, log)
    return ckpt


def _updater_state_for(launch: Launch, ckpt: checkpoint.Checkpoint, log: Callable[[str], None] | None) -> None:
    """A job may go on from its checkpoint with another updater (the job identity leaves it out, as it
    leaves out the learning rate), but the state of the checkpoint's updater means something else to
    this one (SGD's momentum is no Adam average; AdaGrad's sum of squares no RMSProp average): the params
    are resumed, the updater's state and counters start afresh on every rank, said in one line (``log``)."""
    from singa_mpi.config.load import updater_named
    from singa_mpi.registry import selected_name

    theirs, mine = updater_named(ckpt.job_config), selected_name(launch.cfg.proto.updater)
    if theirs is None or theirs == mine or not (ckpt.updater or ckpt.counters):
        return
    ckpt.updater, ckpt.counters = {}, {}
    if log is not None:
        log(f"warning: {ckpt.path}: written with updater {theirs}, this job uses {mine}: the params are resumed, "
            f"{mine}'s state starts afresh ({theirs}'s state means something else to it)")


def _check_job_identity(launch: Launch, ckpt: checkpoint.Checkpoint, options: RunOptions,
                        log: Callable[[str], None] | None) -> None:
    """Refuse another job's checkpoint (ConfigError) unless --allow-other-job (``options``: the run's,
    with the caller's words for them); ``log``: the notes."""
    from singa_mpi.checkpoints.snapshot import other_job

    say = log or (lambda line: None)
    if not ckpt.job_identity:
        say(f"note: {ckpt.path} has no job identity (format {ckpt.format_version}, or converted): "
            f"not checked that this job wrote it")
        return
    mismatch = other_job(launch.cfg, dict(launch.summary.params), ckpt)
    if mismatch and not options.allow_other_job:
        anyway = options.said("--allow-other-job")  # "": the caller has no such option
        ways = [f"resume from it anyway with {anyway} (params taken by name)"] if anyway else []
        ways.append(f"start afresh with {options.said('--overwrite')}")
        raise ConfigError(f"{mismatch}: expected this job's checkpoint: {', or '.join(ways)}")
    if mismatch:
        say(f"note: --allow-other-job: {mismatch}")


def read_checkpoint_paths(cfg: JobConfig, workspace: str, resume: bool,
                          shapes: Sequence[tuple[str, tuple[int, ...]]] | None = None) -> checkpoint.Checkpoint | None:
    """The job's checkpoint_path files, read in phase 1 so that a missing or damaged one is a voted error
    (one line from rank 0) rather than every rank's abort at step 0; None when the job names none, or
    when --resume continues from the workspace's own checkpoints.  ``shapes``: the job's params, as
    :func:`merged_checkpoint_paths` takes them."""
    from singa_mpi.checks.checkpoint_paths import missing_checkpoint_paths

    if not cfg.proto.checkpoint_path or resumes(workspace, resume):
        return None
    missing = missing_checkpoint_paths(cfg)  # a line that names the job writing it, where one does
    if missing:
        raise DataError(missing[0])
    return merged_checkpoint_paths(cfg, dict(shapes) if shapes is not None else None)


def merged_checkpoint_paths(cfg: JobConfig, shapes: Shapes | None = None) -> checkpoint.Checkpoint:
    """The job's checkpoint_path files as one checkpoint of params (SINGA: params matched by name;
    later files override earlier ones).  ``shapes``: the job's params (owners) and their shapes, by
    which SINGA 0.x's parts are joined (None: found here).  A file that is no checkpoint is a
    DataError naming the job's line that names it."""
    from singa_mpi.checks.job import validate

    shapes = dict(validate(cfg).params) if shapes is None else shapes
    merged = None
    for k, path in enumerate(cfg.proto.checkpoint_path):
        try:
            ckpt = read_initial(path, shapes)
        except DataError as err:
            raise DataError(f"{cfg.where('checkpoint_path', k)}: checkpoint_path {path!r}: {err}") from None
        if merged is None:
            merged = ckpt
        else:
            merged.params.update(ckpt.params)
            merged.path = path
    assert merged is not None, "called for a job that names no checkpoint_path"
    return merged



def checkpoints_to_test(workspace: str, checkpoints: list[str] | None, is_root: bool,
                        options: RunOptions | None = None) -> checkpoint.Checkpoint:
    """The --checkpoint files (later ones override earlier ones, as in SINGA), else the workspace's
    newest good checkpoint; DataError when there is none, naming --checkpoint as ``options`` spell it
    (the API: evaluate's argument)."""
    spelled = (options or RunOptions()).said("--checkpoint")
    given = "`--checkpoint FILE`" if spelled == "--checkpoint" else spelled
    if checkpoints:
        ckpt = checkpoint.read(checkpoints[0])
        for path in checkpoints[1:]:  # later files override earlier ones (SINGA)
            ckpt.params.update(checkpoint.read(path).params)
        return ckpt
    with warnings.catch_warnings():
        if not is_root:
            warnings.simplefilter("ignore")  # one report of a damaged file is enough
        ckpt = checkpoint.newest_good(workspace, todo=f"none to test: expected {given} or a workspace with a good "
                                                      f"checkpoint")
    if ckpt is None:
        where = ("the --workspace of a trained run (`singa-mpi train JOB --workspace WS` writes "
                 "WS/checkpoint/step<N>.h5)") if spelled == "--checkpoint" else "a trained workspace"
        raise DataError(f"{workspace}: no checkpoint found: expected {given} or {where}")
    return ckpt
