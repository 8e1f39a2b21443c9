"""The tracer: nested spans, totals per (category, name), the open span the watchdog reports, and
what the serial trainer reports into it."""
import time

import nets
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.tracing import NullTracer, Tracer
from singa_mpi.trainer import Trainer


def test_spans_nest_and_add_up_per_category_and_name():
    tracer = Tracer(rank=3, record=True)
    tracer.step, tracer.direction = 7, "backward"
    with tracer.span("fc1", "backward"):
        inner = tracer.begin("concate(fc1)@0", "comm", {"op": "Recv", "peer": "from rank 1", "tag": 5})
        assert tracer.pending("comm") is inner
        assert "step 7 backward Recv from rank 1 tag 5 in layer concate(fc1)@0" in inner.describe()
        time.sleep(0.001)
        tracer.end(inner, nbytes=1024)
        assert tracer.pending("comm") is None
    comm = tracer.by_name("comm")["concate(fc1)@0"]
    layer = tracer.by_name("backward")["fc1"]
    assert (comm.calls, comm.bytes) == (1, 1024) and layer.calls == 1
    assert layer.seconds >= comm.seconds > 0
    first, second = tracer.events  # the inner span ends first
    assert (first.name, first.rank, first.step, first.bytes) == ("concate(fc1)@0", 3, 7, 1024)
    assert second.start <= first.start and second.start + second.duration >= first.start + first.duration


def test_a_span_left_open_by_an_exception_does_not_corrupt_the_stack():
    tracer = Tracer()
    outer = tracer.begin("outer", "step")
    tracer.begin("inner", "comm")  # never ended: an exception unwound past it
    tracer.end(outer)
    assert tracer.stack == [] and tracer.by_name("step")["outer"].calls == 1


def test_totals_only_unless_recording_and_the_null_tracer_keeps_nothing():
    tracer = Tracer()
    with tracer.span("x", "step"):
        pass
    assert tracer.events == [] and tracer.by_name("step")["x"].calls == 1
    null = NullTracer()
    with null.span("x", "step"):
        pass
    assert null.totals == {} and null.events == []


def test_the_trainer_reports_phases_and_the_net_every_layer(tmp_path):
    data = nets.make_data(str(tmp_path / "d.h5"), 32, (12,), 5)
    cfg = nets.job(nets.mlp(data, 8, "data"))
    runtime = SerialRuntime(cfg, cfg.proto.seed, str(tmp_path))
    trainer = Trainer(cfg, str(tmp_path), runtime, log=lambda line: None)
    for step in range(3):
        trainer.train_one_batch(step)
    tracer = runtime.tracer
    assert {name: t.calls for name, t in tracer.by_name("step").items()} == {
        "train_one_batch": 3, "sync": 3, "update": 3}
    layers = [layer.name for layer in trainer.train_net.layers]
    assert sorted(tracer.by_name("forward")) == sorted(layers)
    assert all(total.calls == 3 for total in tracer.by_name("forward").values())
    assert "fc1" in tracer.by_name("backward") and tracer.step == 2
