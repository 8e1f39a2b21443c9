"""SINGA 0.3 binding's models and job parts (``tool/python/singa/model.py``): a script written for
SINGA's binding runs here with its import lines changed::

    from singa_mpi.compat.singa_v03.model import *          # was: from singa.model import *
    from singa_mpi.compat.singa_v03.datasets import mnist   # was: from examples.datasets import mnist

``Sequential``/``Energy`` collect layers, ``compile`` adds the loss, the updater and the cluster,
``fit``/``evaluate`` build the JobProto the binding built and run it here (serially, or as one rank
under ``mpiexec -n N python script.py``).  ``to_job()`` gives the job as a :class:`singa_mpi.api.Job`.

Where this differs from the binding, on purpose:
* a bad argument raises ArgumentError naming the layer (or part) and the argument; the binding
  asserted, or ignored arguments nothing took;
* ``fit``/``evaluate``'s ``batch_size`` replaces the store's batch size (the binding appended it to
  the repeated field, where SINGA read only the first value, so it had no effect);
* the results: ``{step: {'acc', 'loss', 'ppl', 'se'}}`` of the training reports (the binding parsed
  them from its log, as strings), with the test reports' metrics as ``test_acc``, ``test_loss``, ...
  and the validation's (``validate_data``) as ``val_acc``, ``val_loss``, ...;
  steps are ints, values floats;
* ``evaluate`` after ``fit(..., with_test=True)`` without a ``test_freq`` tests at the start and the
  end of training (``test_freq`` = ``nb_epoch``): the binding's job then never tested (SINGA tests
  every ``test_freq`` steps only), and ``singa-mpi check`` refuses ``test_steps`` without ``test_freq``;
* ``fit`` displays (and returns the results of) every ``nb_epoch // 10`` steps, every step under 10
  (the binding's 0 displayed none);
* ``fit(..., validate_data=X_valid)`` (a Data of phase ``'val'``) validates ``validate_steps``
  batches (default 10, as ``evaluate``'s test) every ``nb_epoch // 10`` steps (at least 1): the
  binding set no ``validate_steps``, so SINGA never validated;
* ``evaluate`` without ``fit`` (a model that only tests) runs its job with the test input read in
  every phase (every net of a job is built here, the training one too; SINGA's ``-test`` built the
  test net alone); the job written (``--write-conf``, ``to_job``) is the binding's;
* no GPU (``device``), no own executable (``execpath``), no Rafiki layer-by-layer calls
  (``ComputeFeature``, ``Dummy``); a second ``build`` replaces the net (the binding merged a second
  copy of every layer into it).

The script's ``argv`` (``Sequential('mlp', sys.argv)``) takes ``--resume`` (continue the workspace's
run), ``--overwrite`` (move an earlier run aside), ``--no-check-finite`` (train on past a NaN or an
infinity) and ``--write-conf PATH`` (write the job's ``.conf`` text and skip the run); SINGA's driver
flags (``-singa_conf ...``) are ignored.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

from google.protobuf import text_format

from singa_mpi.api.fields import ArgumentError
from singa_mpi.api.job import Job
from singa_mpi.api.run import History
from singa_mpi.compat.singa_v03.layer import (ACTIVATIONS, RBM, RGB, Accuracy, Activation, Autoencoder, AvgPooling2D,
                                              Convolution2D, Data, Dense, Dropout, Layer, Loss, LRN2D, MaxPooling2D)
from singa_mpi.compat.singa_v03.names import generate_name, reset_names
from singa_mpi.compat.singa_v03.parameter import Parameter
from singa_mpi.compat.singa_v03.protos import algorithm, check_arguments, fields_of, only, setval
from singa_mpi.data.convert import atomic_path
from singa_mpi.proto import job_pb2

JOB_FIELDS = fields_of(job_pb2.JobProto)
LOSSES = ("categorical_crossentropy", "mean_squared_error")
LR_TYPES = (None, "fixed", "step", "manual", "linear")
ARGV_SPELLING = {"--allow-other-job": ""}  # the options a script's argv takes keep their flags' names
# the test's --checkpoint files, as the binding's evaluate takes them
EVALUATE_SPELLING = {"--checkpoint": "evaluate(..., checkpoint_path=[FILE])"}
# metrics.jsonl's names -> the binding's result keys
RESULT_KEYS = {"accuracy": "acc", "loss": "loss", "perplexity": "ppl", "squared_error": "se"}


class Store:
    """A data store's settings (StoreProto's fields: ``path``, ``backend``, ``batchsize``, ``shape``,
    ``mean_file``, ``mean_value``, ``std_value``, ``random_skip``, ...)."""

    def __init__(self, **kwargs: Any):
        self.proto = setval(job_pb2.StoreProto(), "Store", **kwargs)


class Algorithm:
    """How a step trains: ``type`` an AlgType (``algorithm('bp')``), CD's ``cd_k`` as an argument."""

    def __init__(self, type: int = job_pb2.kBP, **kwargs: Any):
        self.proto = job_pb2.AlgProto(alg=type)
        if type == job_pb2.kCD:
            setval(self.proto.cd_conf, "Algorithm", **kwargs)
        else:
            check_arguments("Algorithm", kwargs, ())


class Updater:
    """The updater: ``upd_type`` (``job_pb2.kSGD``), base learning rate ``lr``, ``lr_type`` None or
    ``'fixed'``, ``'step'`` (×0.997 every 60 steps), ``'manual'`` (``step_lr`` from each of ``step``),
    ``'linear'``; ``decay`` the weight decay, ``momentum``, other UpdaterProto fields by name."""

    def __init__(self, upd_type: int, lr: float, lr_type: str | None, decay: float, momentum: float,
                 step: int | Sequence[int], step_lr: float | Sequence[float], **fields: Any):
        where = "Updater"
        if lr_type not in LR_TYPES:
            raise ArgumentError(f"{where}: argument lr_type = {lr_type!r}: expected one of "
                                f"{', '.join(repr(t) for t in LR_TYPES)}")
        for argument, value in (("decay", decay), ("momentum", momentum)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value < float("inf"):
                raise ArgumentError(f"{where}: argument {argument} = {value!r}: expected a number >= 0")
        self.proto = setval(job_pb2.UpdaterProto(), where, type=upd_type, **fields)
        setval(self.proto.learning_rate, where, base_lr=lr)
        if decay > 0:
            setval(self.proto, where, weight_decay=decay)
        if momentum > 0:
            setval(self.proto, where, momentum=momentum)
        rate = self.proto.learning_rate
        if lr_type in (None, "fixed"):
            rate.type = job_pb2.kFixed
        elif lr_type == "step":
            rate.type = job_pb2.kStep
            setval(rate.step_conf, where, change_freq=60, gamma=0.997)
        elif lr_type == "manual":
            rate.type = job_pb2.kFixedStep
            setval(rate.fixedstep_conf, where, step=step, step_lr=step_lr)
        else:
            rate.type = job_pb2.kLinear
            setval(rate.linear_conf, where, change_freq=10, final_lr=0.1)


def _rate(name: str, lr: float) -> float:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or lr <= 0:
        raise ArgumentError(f"{name}: argument lr = {lr!r}: expected a positive number")
    return lr


class SGD(Updater):
    """Stochastic gradient descent: ``lr``, ``lr_type``, ``decay`` (weight decay), ``momentum``,
    ``step``/``step_lr`` (``lr_type='manual'``)."""

    def __init__(self, lr: float = 0.01, lr_type: str | None = None, decay: float = 0, momentum: float = 0,
                 step: int | Sequence[int] = 0, step_lr: float | Sequence[float] = 0.01, **fields: Any):
        super().__init__(job_pb2.kSGD, _rate("SGD", lr), lr_type, decay, momentum, step, step_lr, **fields)


class AdaGrad(Updater):
    """AdaGrad, with SGD's arguments."""

    def __init__(self, lr: float = 0.01, lr_type: str | None = None, decay: float = 0, momentum: float = 0,
                 step: int | Sequence[int] = 0, step_lr: float | Sequence[float] = 0.01, **fields: Any):
        super().__init__(job_pb2.kAdaGrad, _rate("AdaGrad", lr), lr_type, decay, momentum, step, step_lr,
                         **fields)


class Cluster:
    """Where the job runs: ``workspace`` (required), worker and server groups and their sizes
    (SINGA's frameworks, docs/frameworks.md), other ClusterProto fields by name."""

    def __init__(self, workspace: str | None = None, nworker_groups: int = 1, nserver_groups: int = 1,
                 nworkers_per_group: int = 1, nservers_per_group: int = 1, nworkers_per_procs: int = 1,
                 nservers_per_procs: int = 1, **fields: Any):
        if not workspace:
            raise ArgumentError("Cluster: argument workspace: expected the workspace folder")
        self.proto = setval(job_pb2.ClusterProto(), "Cluster", workspace=workspace, nworker_groups=nworker_groups,
                            nserver_groups=nserver_groups, nworkers_per_group=nworkers_per_group,
                            nservers_per_group=nservers_per_group, nworkers_per_procs=nworkers_per_procs,
                            nservers_per_procs=nservers_per_procs, **fields)


class Model:
    """A model: layers added in order (:meth:`add`), then :meth:`compile`, :meth:`fit`,
    :meth:`evaluate`.  ``name`` the job's name, ``argv`` the script's (see the module's options),
    ``label`` adds SINGA 0.1's label layer (deprecated in the binding)."""

    def __init__(self, name: str = "my model", argv: Sequence[str] | None = None, label: bool = False):
        self.jobconf = job_pb2.JobProto(name=name)
        self.layers: list[Any] = []
        self.label, self.argv = label, list(argv or [])
        self.accuracy = False
        self.trained = False  # fit ran the job: evaluate then tests its newest checkpoint

    def add(self, layer: Any) -> None:
        """Add a layer (each kind of model says how its layers join)."""
        raise NotImplementedError

    def exist_datalayer(self, phase: str) -> bool:
        """Whether an input layer of ``phase`` (``'train'``, ``'test'``, ``'val'``) was added."""
        wanted = {"train": job_pb2.kTrain, "test": job_pb2.kTest, "val": job_pb2.kVal}[phase]
        return any(wanted in layer.layer.include for layer in self.layers)

    def compile(self, optimizer: Updater | None = None, cluster: Cluster | None = None, loss: str | None = None,
                topk: int = 1, **kwargs: Any) -> None:
        """The updater, the cluster and the loss: ``'categorical_crossentropy'`` (a softmax loss,
        made of a last softmax activation or added) or ``'mean_squared_error'`` (euclidean)."""
        for key in kwargs:  # before the arguments it lacks: compile(updater=sgd) lacks optimizer
            why = " (the updater is its optimizer)" if key == "updater" else ""
            raise ArgumentError(f"compile: unknown argument {key}: expected compile(optimizer=..., cluster=..., "
                                f"loss=..., topk=...){why}")
        if not isinstance(optimizer, Updater):
            raise ArgumentError(f"compile: argument optimizer = {optimizer!r}: expected an updater such as SGD(...)")
        if not isinstance(cluster, Cluster):
            raise ArgumentError(f"compile: argument cluster = {cluster!r}: expected Cluster(workspace)")
        if loss is not None and loss not in LOSSES:
            raise ArgumentError(f"compile: argument loss = {loss!r}: expected one of {', '.join(LOSSES)}"
                                + (" (the rnnlm user loss is not supported)" if loss == "user_loss_rnnlm" else ""))
        if not self.layers and loss is not None:
            raise ArgumentError("compile: the model has no layers: add them before compile")
        self.jobconf.updater.CopyFrom(optimizer.proto)
        self.jobconf.cluster.CopyFrom(cluster.proto)
        if loss is None:
            return
        last = self.layers[-1]
        top = last.mask if getattr(last, "mask", None) is not None else last.layer
        if top.type == job_pb2.kSoftmax:  # the last softmax becomes the loss layer
            if loss == "categorical_crossentropy":
                top.type = job_pb2.kSoftmaxLoss
                top.softmaxloss_conf.topk = topk
            else:
                top.type = job_pb2.kEuclideanLoss
        else:
            self.add(Loss("softmaxloss", topk=topk) if loss == "categorical_crossentropy" else Loss("euclideanloss"))

    def build(self) -> job_pb2.JobProto:
        """The net from the layers, chained in order (an input layer's name is the first's: every input
        layer is called ``data<n>``), the labels going to the last; the whole JobProto."""
        if not self.layers:
            raise ArgumentError("build: the model has no layers")
        net = job_pb2.NetProto()
        source = first = self.layers[0].layer.name
        last: Any = None
        hidden: Any = None
        for layer in self.layers:
            proto = net.layer.add()
            proto.CopyFrom(layer.layer)
            last = proto
            if layer.is_datalayer:
                continue
            proto.srclayers.append(source)
            source = proto.name
            for attached in (getattr(layer, "mask", None), getattr(layer, "bidirect", None)):
                if attached is not None:
                    added = net.layer.add()
                    added.CopyFrom(attached)
                    added.srclayers.append(source)
                    if attached is layer.mask:
                        source, last = added.name, added
                    else:
                        hidden = added
        if self.label:  # SINGA 0.1's label layer between the data and the loss
            label = net.layer.add(name="label", type=job_pb2.kLabel)
            label.srclayers.append(first)
            last.srclayers.append("label")
        elif last.name == "RBMVis" and hidden is not None:
            last.srclayers.append(hidden.name)
        else:
            last.srclayers.append(first)
        if self.accuracy:
            softmax = net.layer.add(name="softmax", type=job_pb2.kSoftmax, include=[job_pb2.kTest])
            softmax.srclayers.append(self.layers[-1].layer.name)
            accuracy = net.layer.add()
            accuracy.CopyFrom(Accuracy(include=job_pb2.kTest).layer)
            accuracy.srclayers.extend(["softmax", first])
        self.jobconf.neuralnet.CopyFrom(net)
        return self.jobconf

    def fit(self, data: Data | None = None, alg: str = "bp", nb_epoch: int = 0, with_test: bool = False,
            execpath: str = "", device: Any = None, **fields: Any) -> dict[int, dict[str, float]] | None:
        """Train ``nb_epoch`` steps on ``data``; with ``with_test`` the run waits for :meth:`evaluate`
        (one job, tested as it trains).  ``fields``: ``batch_size``, ``validate_data`` and JobProto's
        fields (``disp_freq``, ``checkpoint_freq``, ...).  The results (the module says their form)."""
        if not isinstance(data, Data):
            raise ArgumentError(f"fit: argument data = {data!r}: expected the training data (load_data's first value)")
        _steps("fit", "nb_epoch", nb_epoch)
        _cpu_only("fit", execpath, device)
        check_arguments("fit", fields, JOB_FIELDS | {"batch_size", "validate_data"})
        if "batch_size" in fields:
            _batch_size(data, fields["batch_size"], "fit")
        if not self.exist_datalayer("train"):
            self.layers.insert(0, data)
        # the binding's nb_epoch // 10 is 0 under 10 steps: SINGA then displayed nothing, and fit returned {}
        setval(self.jobconf, "fit", train_steps=nb_epoch, disp_freq=fields.get("disp_freq", max(nb_epoch // 10, 1)))
        if "validate_data" in fields:
            _validation_data(fields["validate_data"])
            self.layers.insert(1, fields["validate_data"])
            # the binding set no validate_steps (SINGA validated none) and nb_epoch // 10 may be 0
            setval(self.jobconf, "fit", validate_freq=max(nb_epoch // 10, 1), validate_steps=10)
        setval(self.jobconf, "fit", **only(fields, JOB_FIELDS))
        if data.checkpoint is not None:
            setval(self.jobconf, "fit", checkpoint_path=data.checkpoint)
        setval(self.jobconf, "fit", checkpoint_freq=nb_epoch)  # the binding kept the trained model
        self.jobconf.train_one_batch.CopyFrom(Algorithm(algorithm(alg, "fit")).proto)
        if with_test:
            return None  # evaluate() runs the job
        self._compiled("fit")
        self.build()
        return self._run(test_only=False)

    def evaluate(self, data: Data | None = None, alg: str = "bp", checkpoint_path: list[str] | None = None,
                 execpath: str = "", device: Any = None, show_acc: bool = False,
                 **fields: Any) -> dict[int, dict[str, float]]:
        """Test on ``data`` (``test_steps`` batches, default 10; ``test_freq``, ``batch_size``): after
        ``fit(..., with_test=True)`` the training job tested as it trains; else the test alone on
        ``checkpoint_path`` (default: the workspace's newest checkpoint; SINGA's ``step100-worker0``
        is read as this tool's ``step100.h5`` in that folder).  ``show_acc`` adds an
        accuracy layer to the test."""
        if not isinstance(data, Data):
            raise ArgumentError(f"evaluate: argument data = {data!r}: expected the test data (load_data's second "
                                f"value)")
        _cpu_only("evaluate", execpath, device)
        check_arguments("evaluate", fields, JOB_FIELDS | {"batch_size"})
        if "batch_size" in fields:
            _batch_size(data, fields["batch_size"], "evaluate")
        if not self.exist_datalayer("test"):
            self.layers.insert(0, data)
        # Keras's order, fit(X) then evaluate(X_test): test what fit trained (it used to train again,
        # or refuse the workspace fit had just filled)
        test_only = not self.exist_datalayer("train") or self.trained
        if test_only and checkpoint_path is not None:
            setval(self.jobconf, "evaluate", checkpoint_path=checkpoint_path)
        setval(self.jobconf, "evaluate", test_steps=fields.get("test_steps", 10))
        setval(self.jobconf, "evaluate", **only(fields, JOB_FIELDS))
        if self.jobconf.HasField("train_steps") and self.jobconf.test_freq <= 0:
            # SINGA tested only every test_freq steps, so the binding's job without one never tested;
            # here the test is asked for (test_steps), so it runs at the start and the end of training
            self.jobconf.test_freq = max(self.jobconf.train_steps, 1)
        self.jobconf.train_one_batch.CopyFrom(Algorithm(algorithm(alg, "evaluate")).proto)
        self.accuracy = show_acc
        self._compiled("evaluate")
        self.build()
        return self._run(test_only=test_only)

    # ------------------------------------------------------------ beyond the binding

    def to_job(self) -> Job:
        """The job as built so far (call after ``fit``/``evaluate`` or :meth:`build`) as a
        :class:`singa_mpi.api.Job`."""
        return Job.from_proto(self.jobconf)

    def to_conf(self, path: str | os.PathLike | None = None) -> str:
        """The job's ``.conf`` text, written to ``path`` when given."""
        return self.to_job().to_conf(path)

    def display(self) -> None:
        """Print the JobProto built so far, as text."""
        print(text_format.MessageToString(self.jobconf))

    def size(self) -> int:
        """The number of layers of the built net."""
        return len(self.jobconf.neuralnet.layer)

    def layer_by_id(self, k: int) -> job_pb2.LayerProto:
        """The built net's ``k``-th LayerProto."""
        return self.jobconf.neuralnet.layer[k]

    def _compiled(self, where: str) -> None:
        """ArgumentError unless ``compile`` gave the job its cluster (and updater): the net built without
        it fails the job's check on a loss layer that is not there, naming no call."""
        if not self.jobconf.HasField("cluster"):
            raise ArgumentError(f"{where}: the model is not compiled: expected m.compile(loss=..., optimizer=..., "
                                f"cluster=Cluster(workspace)) first")
        if not isinstance(self, Energy) and not any(_is_loss(layer) for layer in self.layers):
            # compile(loss=None) is an Energy model's (its RBM scores itself): the job's check said only
            # that the last softmax had the labels as a second source
            raise ArgumentError(f"{where}: the model has no loss: expected m.compile(loss=..., ...) with one of "
                                f"{', '.join(repr(name) for name in LOSSES)} (loss=None is for an Energy model's RBM)")

    def _run(self, test_only: bool) -> dict[int, dict[str, float]]:
        options = _argv_options(self.argv)
        job = self.to_job()
        if options["write_conf"]:
            # every rank writes the same text, each through its own temporary file: none reads half
            with atomic_path(options["write_conf"], "the job's .conf text") as temporary:
                job.to_conf(temporary)
            return {}
        if test_only:
            # SINGA's names (step100-worker0), as the job's checkpoint_path reads them: this tool's step100.h5
            checkpoints = [_ours(path) for path in self.jobconf.checkpoint_path] or None
            inputs = {layer.layer.name for layer in self.layers if layer.is_datalayer}
            tested = _testable(job, inputs).evaluate(checkpoints=checkpoints, said_as=EVALUATE_SPELLING)
            return results([{**tested, "phase": "test"}])
        # the script's argv takes --resume and --overwrite: the run's messages name them so
        history = job.fit(resume=options["resume"], overwrite=options["overwrite"],
                          check_finite=options["check_finite"], check_memory=options["check_memory"],
                          said_as=ARGV_SPELLING)
        self.trained = True
        return results(history.records)


class Sequential(Model):
    """Layers in a chain; an :class:`Autoencoder` unfolds into its Dense layers."""

    def __init__(self, name: str = "my model", argv: Sequence[str] | None = None, label: bool = False):
        super().__init__(name, argv, label)

    def add(self, layer: Any) -> None:
        """Add ``layer`` at the end of the chain (an Autoencoder: its Dense layers)."""
        if getattr(layer, "layer_type", None) == "AutoEncoder":
            self.layers.extend(_autoencoder_layers(layer))
        elif isinstance(layer, Layer):
            self.layers.append(layer)
        else:
            raise ArgumentError(f"Sequential.add: argument layer = {layer!r}: expected a layer such as Dense(...)")


class Energy(Model):
    """An energy model: an :class:`RBM` whose lower levels (``RBM([1000, 500])``) unfold into
    sigmoid Dense layers holding the lower RBMs' params (``w1``, ``b12``: from their checkpoints)."""

    def __init__(self, name: str = "my model", argv: Sequence[str] | None = None, label: bool = False):
        super().__init__(name, argv, label)

    def add(self, layer: Any) -> None:
        """Add the RBM (its lower levels first, as sigmoid Dense layers)."""
        if getattr(layer, "layer_type", None) != job_pb2.kRBMVis:
            raise ArgumentError(f"Energy.add: argument layer = {layer!r}: expected an RBM")
        for level in range(1, len(layer.out_dim)):
            self.layers.append(Dense(layer.out_dim[level - 1], activation="sigmoid",
                                     w_param=Parameter(name="w", init="none", level=level),
                                     b_param=Parameter(name="b", init="none", level=level)))
        self.layers.append(layer)


def _is_loss(layer: Any) -> bool:
    """Whether a layer of the chain (or the softmax compile made a loss of) computes a loss."""
    from singa_mpi.layers.base import layer_class_of

    for proto in (layer.layer, getattr(layer, "mask", None)):
        if proto is None:
            continue
        try:
            if layer_class_of(proto).is_loss:
                return True
        except Exception:  # a type this process cannot build (a plugin's): the job's check says what it is
            return True
    return False


def _autoencoder_layers(auto: Autoencoder) -> list[Dense]:
    """The binding's unfolding: encoders w1, b12 ... (the last without activation), then decoders
    that use the encoders' weights transposed and the visible biases b1 ...; without
    ``param_share`` an MLP of hid_dim then out_dim."""
    dims, layers = auto.hid_dim, []
    if not auto.param_share:
        for level, dim in enumerate(dims + [auto.out_dim], start=1):
            layers.append(Dense(dim, activation=auto.activation, w_param=Parameter(name="w", init="none", level=level),
                                b_param=Parameter(name="b", init="none", level=level)))
        return layers
    for level, dim in enumerate(dims, start=1):
        layers.append(Dense(dim, activation=auto.activation if level < len(dims) else None,
                            w_param=Parameter(name="w", init="none", level=level),
                            b_param=Parameter(name="b", init="none", level=level)))
    for level in range(len(dims), 0, -1):
        weight = Parameter(name=generate_name("w", 2), init="none")
        bias = Parameter(name=generate_name("b", 2), init="none")
        setval(weight.param, "Autoencoder", share_from=f"w{level}")
        setval(bias.param, "Autoencoder", name=f"b{level}")
        dim = auto.out_dim if level == 1 else dims[level - 2]
        layers.append(Dense(dim, activation=auto.activation, w_param=weight, b_param=bias, transpose=True))
    return layers


def _testable(job: Job, inputs: set[str]) -> Job:
    """A test-only job (``evaluate`` without ``fit``: its input layers, named ``inputs``, all of phase
    test) as this project runs one: every net of a job is built, the training one too, so the test
    inputs are read by every phase (SINGA's ``-test`` built the test net alone); nothing trains, the
    test is the same."""
    mine = [layer for layer in job.net.layers if layer.name in inputs]
    if any(job_pb2.kTrain in layer.proto.include or not layer.proto.include for layer in mine):
        return job
    copy = Job.from_proto(job.to_proto())
    for layer in copy.net.layers:
        if layer.name in inputs and list(layer.proto.include) == [job_pb2.kTest]:
            layer.proto.ClearField("include")
    return copy


def results(records: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """The binding's results from the run's records: per step, the training metrics (``acc``,
    ``loss``, ``ppl``, ``se``), the test's as ``test_acc``, ... and the validation's as ``val_acc``, ...."""
    found: dict[int, dict[str, float]] = {}
    for record in records:
        prefix = {"train": "", "test": "test_", "val": "val_"}.get(record.get("phase", ""))
        if prefix is None:
            continue
        for name, value in record.items():
            if name in RESULT_KEYS:
                found.setdefault(int(record.get("step", 0)), {})[prefix + RESULT_KEYS[name]] = float(value)
    return found


def _ours(path: str) -> str:
    """A checkpoint the test reads: SINGA's name ``DIR/step<N>-worker0`` that is not there as this
    tool's ``DIR/step<N>.h5`` where that is (as the job's ``checkpoint_path`` reads it), else ``path``."""
    from singa_mpi.checkpoints.tools import ours_for_singa_name

    ours = ours_for_singa_name(path)
    return ours if ours is not None and os.path.exists(ours) else path


def _validation_data(data: Any) -> None:
    """fit's ``validate_data``: a Data of phase val (load_data's X_test is of phase test: the
    validation net would have no input)."""
    phases = {job_pb2.kTrain: "train", job_pb2.kTest: "test", job_pb2.kVal: "val"}
    if not isinstance(data, Data):
        raise ArgumentError(f"fit: argument validate_data = {data!r}: expected a Data of phase 'val' "
                            f"(Data(..., phase='val'))")
    if list(data.layer.include) != [job_pb2.kVal]:
        given = ", ".join(repr(phases.get(phase, phase)) for phase in data.layer.include) or "every phase"
        raise ArgumentError(f"fit: argument validate_data: a Data of phase {given}: expected a Data of phase 'val' "
                            f"(Data(..., phase='val'))")


def _batch_size(data: Data, size: int, where: str) -> None:
    if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
        raise ArgumentError(f"{where}: argument batch_size = {size!r}: expected a positive integer")
    del data.layer.store_conf.batchsize[:]
    setval(data.layer.store_conf, data.where, batchsize=size)


def _steps(where: str, argument: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise ArgumentError(f"{where}: argument {argument} = {value!r}: expected a positive number of steps")


def _cpu_only(where: str, execpath: str, device: Any) -> None:
    if device is not None:
        raise ArgumentError(f"{where}: argument device = {device!r}: singa_mpi trains on CPUs: expected None")
    if execpath:
        raise ArgumentError(f"{where}: argument execpath = {execpath!r}: the job runs in this process: expected ''")


def _argv_options(argv: Sequence[str]) -> dict[str, Any]:
    """``--resume``, ``--overwrite``, ``--no-check-finite``, ``--no-check-memory``, ``--write-conf PATH`` from
    the script's argv (SINGA's own flags, ``-singa_conf FILE`` and the like, mean nothing here and are left alone)."""
    options: dict[str, Any] = {"resume": False, "overwrite": False, "check_finite": True, "check_memory": True,
                               "write_conf": None}
    args = list(argv[1:])
    for index, arg in enumerate(args):
        if arg in ("--resume", "-resume"):
            options["resume"] = True
        elif arg == "--overwrite":
            options["overwrite"] = True
        elif arg == "--no-check-finite":
            options["check_finite"] = False
        elif arg == "--no-check-memory":
            options["check_memory"] = False
        elif arg.startswith("--write-conf="):
            options["write_conf"] = arg.split("=", 1)[1]
        elif arg == "--write-conf":
            if index + 1 >= len(args):
                raise ArgumentError("argv: --write-conf: expected the path of the .conf file to write")
            options["write_conf"] = args[index + 1]
    return options



__all__ = ["Model", "Sequential", "Energy", "Store", "Algorithm", "Updater", "SGD", "AdaGrad", "Cluster", "History",
           "Layer", "Data", "Convolution2D", "MaxPooling2D", "AvgPooling2D", "LRN2D", "Loss", "Activation", "Dropout",
           "Accuracy", "RGB", "Dense", "Autoencoder", "RBM", "Parameter", "generate_name", "reset_names", "results",
           "ACTIVATIONS"]
