"""BPTT over SINGA's char-rnn: the state carried between batches, restarted where the text wraps,
checkpointed so a resumed run continues exactly; plans of the unrolled net; bad fields."""
import dataclasses
import json

import numpy as np
import pytest

import nets
from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.checks.job import validate
from singa_mpi.config.load import parse_job
from singa_mpi.errors import ConfigError
from singa_mpi.runtimes.serial import SerialRuntime
from singa_mpi.trainer import Trainer
from checkpoint_jobs import final, mpi_train, train


def job_file(tmp_path, scheme="data", steps=16, name="rnn", batch=3, size=120, nranks=2):
    text, vocab = nets.text_data(str(tmp_path / "text"), size=size)
    path = tmp_path / f"{name}.conf"
    path.write_text(nets.char_rnn(text, vocab, batch, scheme, nranks, steps=steps, test=True))
    return str(path)


def test_the_state_restarts_exactly_when_the_reader_wraps(tmp_path):
    cfg = parse_job(open(job_file(tmp_path)).read())
    trainer = Trainer(cfg, str(tmp_path / "ws"), SerialRuntime(cfg, 5, str(tmp_path / "ws")), log=lambda line: None)
    reader = next(layer for layer in trainer.train_net.layers if layer.name == "data")
    first_gru = next(layer for layer in trainer.train_net.layers if layer.name == "0#gru1")
    restarts = []
    for step in range(16):
        trainer.train_one_batch(step)
        restarts.append(reader.restarted)
        assert (first_gru.initial_state is None) == reader.restarted  # zeros exactly when the streams restart
    assert sum(restarts) >= 2  # 40 characters per row, windows of 5: it wraps every 7 batches


def test_resume_mid_text_is_bitwise(tmp_path):
    conf = job_file(tmp_path)
    assert train(conf, tmp_path / "straight") == 0
    assert train(conf, tmp_path / "split", steps=5) == 0  # between two wraps: a state is carried
    saved = final(tmp_path / "split", 5)
    assert saved.carried["train"]["0#gru1"]["hidden"].shape == (3, 8) and saved.readers["train"]["data"]["offset"]
    assert train(conf, tmp_path / "split", resume=True) == 0
    a, b = final(tmp_path / "straight", 16), final(tmp_path / "split", 16)
    for name in a.params:
        np.testing.assert_array_equal(a.params[name], b.params[name])
    np.testing.assert_array_equal(a.carried["train"]["0#gru1"]["hidden"], b.carried["train"]["0#gru1"]["hidden"])


@pytest.mark.slow
def test_resume_on_other_rank_counts_continues_within_float_noise(tmp_path):
    conf = job_file(tmp_path, batch=4, size=160)
    assert train(conf, tmp_path / "serial") == 0
    mpi_train(2, conf, tmp_path / "moving", "--steps", "5")
    location = job_file(tmp_path, "location", batch=4, size=160, name="loc", nranks=3)
    mpi_train(3, location, tmp_path / "moving", "--steps", "11", "--resume")
    mpi_train(1, conf, tmp_path / "moving", "--resume")
    want, got = final(tmp_path / "serial", 16), final(tmp_path / "moving", 16)
    for name, value in want.params.items():
        assert float(np.abs(got.params[name] - value).max()) / float(np.abs(value).max()) < 1e-5, name


def test_a_gru_split_on_hidden_units_cannot_carry_its_state(tmp_path):
    text = open(job_file(tmp_path)).read().replace('type: kGRU srclayers: "onehot"',
                                                   'type: kGRU srclayers: "onehot" partition_dim: 1')
    with pytest.raises(ConfigError, match=r"layer '0#gru1' .*partition_dim = 1: expected 0 or -1: its hidden "
                                          r"state is carried from batch to batch"):
        validate(parse_job(text, "rnn.conf"))


def test_plan_lists_time_step_0_unless_full(tmp_path, capsys):
    conf = job_file(tmp_path)
    assert cli.main(["plan", conf, "-n", "2"]) == 0
    out = capsys.readouterr().out
    assert "0#gru1@0" in out and "1#gru1@0" not in out and "(x5 time steps)" in out
    assert "plan --full lists every copy" in out
    assert cli.main(["plan", conf, "-n", "2", "--full"]) == 0
    out = capsys.readouterr().out
    assert all(f"{t}#gru1@1" in out for t in range(5))


def test_loss_falls_and_metrics_are_per_character(tmp_path):
    conf = job_file(tmp_path, steps=60)
    assert train(conf, tmp_path / "ws") == 0
    losses = [json.loads(line)["loss"] for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()
              if '"train"' in line]
    assert losses[0] > 2.0 and np.mean(losses[-5:]) < 0.7 * losses[0]  # ln(vocab) at first, then falls


def test_test_phase_reports_loss_and_perplexity(tmp_path):
    conf = job_file(tmp_path, steps=10)
    assert train(conf, tmp_path / "ws") == 0
    entries = [json.loads(line) for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    tests = [e for e in entries if e["phase"] == "test"]
    assert tests and all(e["perplexity"] == pytest.approx(np.exp(e["loss"]), rel=1e-12) for e in tests)


def test_missing_text_is_one_line_before_training(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "rnn.conf"
    conf.write_text(nets.char_rnn("gone/input.txt", "gone/vocab.txt", 3, steps=2))
    assert cli.main(["train", str(conf), "--workspace", str(tmp_path / "ws")]) == 3
    err = capfd.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert "layer 'data': char_rnn_conf.path gone/input.txt: no such file" in err
    assert "singa-mpi data text --out DIR" in err
    assert not (tmp_path / "ws" / "metrics.jsonl").exists()


# ------------------------------------------------------------------ worker groups

def test_a_resumed_group_restarts_its_state_where_its_own_text_wraps(tmp_path):
    """A group whose reader resumes ``ahead<g>`` windows beyond group 0 (an asynchronous group) wraps that
    many steps earlier; every worker of the group learns it from the checkpoint, the reader's or not."""
    cfg = parse_job(open(job_file(tmp_path, size=240)).read())
    algorithm = Trainer(cfg, str(tmp_path / "ws"), SerialRuntime(cfg, 5, str(tmp_path / "ws")),
                        log=lambda line: None).algorithm
    states = {"data": {"offset": 10, "groups": 2, "ahead1": 3}}
    algorithm.resume_readers(states, (1, 2))
    assert algorithm.ahead == 3
    algorithm.resume_readers(states, (0, 2))
    assert algorithm.ahead == 0
    algorithm.resume_readers({"data": {"offset": 10}}, (1, 2))  # an older state: group 0's pace
    assert algorithm.ahead == 0

HOGWILD = ("\ncluster { nworker_groups: 2 nserver_groups: 2 nworkers_per_group: 1 nservers_per_group: 1 "
           "server_worker_separate: false sync_freq: 1 share_memory: false }\n")


def hidden(ckpt, group):
    return (ckpt.carried if group == 0 else ckpt.group_carried[group])["train"]["0#gru1"]["hidden"]


@pytest.mark.slow
def test_hogwild_groups_resume_each_at_its_own_text_position_and_hidden_state(tmp_path):
    """Two distributed Hogwild groups (one pace), each its own part of the text: 2 steps, stop, resume to 6
    (before the text wraps after 7, so the state carried at step 2 still counts) equals 6 straight, bitwise,
    for each group's hidden state.  The learning rate is 0: Hogwild's copies exchange their changes, which
    a resume of any job does not reproduce bit for bit (asynchronous), so the params stay put and what is
    compared is what each group reads and carries.  A checkpoint without per-group state (an older one)
    still loads, every group from group 0's, and says so in one line."""
    conf = tmp_path / "hog.conf"
    text = open(job_file(tmp_path, steps=6, size=240)).read().replace("base_lr: 0.01", "base_lr: 0")
    conf.write_text(text + HOGWILD)
    mpi_train(2, str(conf), tmp_path / "straight")
    mpi_train(2, str(conf), tmp_path / "split", "--steps", "2")
    saved = final(tmp_path / "split", 2)
    assert saved.worker_groups == 2 and saved.readers["train"]["data"] == {"offset": 10, "groups": 2}
    assert not np.array_equal(hidden(saved, 0), hidden(saved, 1))  # each group its own part of the text
    older = dataclasses.replace(saved, worker_groups=0, group_carried={},
                                readers={"train": {"data": {"offset": 10}}})
    checkpoint.write(checkpoint.checkpoint_path(str(tmp_path / "older"), 2), older)
    resumed = mpi_train(2, str(conf), tmp_path / "split", "--resume")
    assert "note:" not in resumed.stdout
    want, got = final(tmp_path / "straight", 6), final(tmp_path / "split", 6)
    for group in (0, 1):
        np.testing.assert_array_equal(hidden(got, group), hidden(want, group))
    assert got.readers == want.readers
    old = mpi_train(2, str(conf), tmp_path / "older", "--resume").stdout
    assert old.count("holds worker group 0's text position and hidden state alone (written with one group, "
                     "or before states were kept per group): every one of the 2 groups resumes from them") == 1
    before = final(tmp_path / "older", 6)
    np.testing.assert_array_equal(hidden(before, 0), hidden(want, 0))
    assert not np.array_equal(hidden(before, 1), hidden(want, 1))  # group 1 went on from group 0's state


@pytest.mark.slow
def test_downpour_groups_resume_at_their_own_positions_and_say_their_state_starts_from_zeros(tmp_path):
    """Downpour's groups go at their own pace and are not waited for at a checkpoint: their positions are
    kept (``groups``, ``ahead<g>`` from the servers' counts), their hidden states are not, which the
    resume says in one line."""
    conf = tmp_path / "downpour.conf"
    conf.write_text(open(job_file(tmp_path, steps=9, size=240)).read()
                    + "\ncluster { nworker_groups: 2 nserver_groups: 1 nworkers_per_group: 1 nservers_per_group: 1 "
                      "server_worker_separate: true }\n")
    mpi_train(3, str(conf), tmp_path / "ws", "--steps", "5")
    saved = final(tmp_path / "ws", 5)
    assert saved.worker_groups == 2 and saved.group_carried == {}
    assert saved.readers["train"]["data"] == {"offset": 25, "groups": 2}  # every group trained 5 steps
    out = mpi_train(3, str(conf), tmp_path / "ws", "--resume").stdout
    assert out.count("note:") == 1 and "worker group(s) 1 resume at their own text positions with a hidden " \
                                       "state of zeros" in out
    assert final(tmp_path / "ws", 9).readers["train"]["data"] == {"offset": 10, "groups": 2}  # 9 = 7 + 2
