"""`singa-mpi sample`: a trained char-rnn writes the seed text and N characters of its vocabulary, the
same ones for the same --seed, likelier under the data than random text, with the GRU's state carried
from character to character; jobs of another shape, unknown seed characters and missing checkpoints are
one-line errors.  conf/char_rnn.conf trains on a small `data text` corpus and then samples."""
import json
import pathlib
import re

import numpy as np
import pytest

import nets
from singa_mpi import cli
from singa_mpi.checkpoints import hdf5 as checkpoint
from singa_mpi.config.load import load_job, parse_job
from singa_mpi.data.synthetic import write_synthetic
from singa_mpi.launcher import RunOptions, run_training
from singa_mpi.sampling import Sampler, generate, softmax

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 60


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(job path, workspace, corpus bytes, vocabulary bytes) of a tiny char-rnn trained STEPS steps."""
    folder = tmp_path_factory.mktemp("charrnn")
    text, vocab = nets.text_data(str(folder / "data"), size=8000)
    job = folder / "charrnn.conf"
    job.write_text(nets.char_rnn(text, vocab, batch=8, scheme="data", steps=STEPS, unroll=10, hidden=32))
    workspace = folder / "ws"
    assert run_training(str(job), lambda cfg: str(workspace), RunOptions()) == 0
    return str(job), str(workspace), pathlib.Path(text).read_bytes(), pathlib.Path(vocab).read_bytes()


def sample(capfd, job, workspace, *extra):
    """(exit code, stdout bytes less the final newline, stderr) of `singa-mpi sample`."""
    try:
        code = cli.main(["sample", job, "--workspace", workspace, *extra])
    except SystemExit as stop:  # a bad option value: argparse's one line, exit 2
        code = stop.code
    out, err = capfd.readouterr()
    assert code != 0 or out.endswith("\n")
    return code, out[:-1].encode("latin-1") if code == 0 else out.encode(), err


def bigram_hits(text: bytes, corpus: bytes) -> float:
    """The share of ``text``'s adjacent pairs that occur in ``corpus``."""
    known = {corpus[i:i + 2] for i in range(len(corpus) - 1)}
    return np.mean([text[i:i + 2] in known for i in range(len(text) - 1)])


def test_sample_prints_the_seed_then_n_characters_of_the_vocabulary(trained, capfd):
    job, workspace, _, vocab = trained
    code, out, err = sample(capfd, job, workspace, "--seed-text", "def ", "-n", "300")
    assert code == 0
    assert out.startswith(b"def ") and len(out) == 4 + 300
    assert set(out) <= set(vocab)
    assert f"step{STEPS}.h5 (step {STEPS})" in err  # the newest checkpoint, named on stderr
    code, again, _ = sample(capfd, job, workspace, "--checkpoint", f"{workspace}/checkpoint/step{STEPS}.h5",
                            "--seed-text", "def ", "-n", "300")
    assert code == 0 and again == out


def test_the_same_seed_gives_the_same_text_and_a_higher_temperature_another(trained, capfd):
    job, workspace, _, _ = trained
    runs = {args: sample(capfd, job, workspace, "-n", "200", *args)[1]
            for args in [(), ("--seed", "0"), ("--seed", "7"), ("--temperature", "2.5")]}
    assert runs[()] == runs[("--seed", "0")]
    assert runs[()] != runs[("--seed", "7")]
    assert runs[()] != runs[("--temperature", "2.5")]
    assert all(text.startswith(b"\n") and len(text) == 201 for text in runs.values())  # the default seed text


def test_a_trained_model_samples_likelier_text_than_random_characters(trained, capfd):
    job, workspace, corpus, vocab = trained
    _, out, _ = sample(capfd, job, workspace, "-n", "1000", "--temperature", "0.8")
    rng = np.random.default_rng(0)
    uniform = bytes(rng.choice(np.frombuffer(vocab, np.uint8), 1000))
    assert bigram_hits(out, corpus) > bigram_hits(uniform, corpus) + 0.4  # measured: 0.98 vs 0.17


def test_the_gru_state_is_carried_from_character_to_character(trained):
    job, workspace, _, _ = trained
    ckpt = checkpoint.newest_good(workspace)
    sampler = Sampler(load_job(job), ckpt.params, workspace)
    a, b, last = sampler.encode(b"d"), sampler.encode(b"i"), sampler.encode(b" ")[0]

    def logits(prefix, carry=True):
        sampler.reset()
        for index in prefix:
            sampler.step(index)
        if not carry:
            sampler.reset()
        return sampler.step(last)

    assert not np.allclose(logits(a), logits(b))  # what came before " " matters
    np.testing.assert_array_equal(logits(a, carry=False), logits(b, carry=False))
    np.testing.assert_allclose(softmax(logits(a), 1.0).sum(), 1.0)
    # generate feeds its samples back with the state carried: forgetting it gives another text
    sampler.reset()
    carried = generate(sampler, b"def ", 50, rng=np.random.default_rng(1))
    original = sampler.step

    def forgetful(index):  # every character from zeros, as SINGA sampled (its bug B7)
        sampler.reset()
        return original(index)

    sampler.step = forgetful
    assert generate(sampler, b"def ", 50, rng=np.random.default_rng(1)) != carried


def test_sample_errors_are_one_line(trained, capfd, tmp_path):
    job, workspace, _, _ = trained
    cases = [
        ((job, workspace, "--seed-text", "dé"), 2, (r"--seed-text 'dé': byte 0xc3 'Ã' at offset 1 is not in the "
                                                   r"vocabulary .*vocab.txt: expected characters of the training text")),
        ((job, str(tmp_path / "empty")), 3, r"empty: no checkpoint found: expected `--checkpoint FILE`"),
        ((job, workspace, "--checkpoint", str(tmp_path / "no.h5")), 3, r"no.h5: no such file"),
        ((job, workspace, "--temperature", "0"), 2, r"--temperature: 0: expected a finite number > 0"),
        ((job, workspace, "-n", "-1"), 2, r"-n: -1: expected an integer >= 0"),
        ((str(ROOT / "conf" / "digits_mlp.conf"), workspace), 2,
         r"digits_mlp.conf: train phase: no kCharRNN input layer: expected SINGA's char-rnn net"),
    ]
    for args, want_code, message in cases:
        code, out, err = sample(capfd, *args)
        assert (code, out) == (want_code, b""), args
        assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
        assert re.search(message, err), err


def test_a_net_without_a_gru_below_the_logits_is_refused(trained, capfd, tmp_path):
    job, workspace, _, _ = trained
    text = pathlib.Path(job).read_text().replace('srclayers: "gru1"', 'srclayers: "onehot"')
    no_gru = tmp_path / "no_gru.conf"
    no_gru.write_text(text)
    parse_job(text)  # still a valid job
    code, _, err = sample(capfd, str(no_gru), workspace)
    assert code == 2 and "no kGRU layer below the logits 'ip1'" in err


@pytest.mark.slow
def test_the_example_trains_on_a_small_corpus_and_samples(tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    conf = str(ROOT / "conf" / "char_rnn.conf")
    assert cli.main(["data", "text", "--out", "data/text", "--max-bytes", "50000"]) == 0
    assert cli.main(["train", conf, "--steps", "40", "--workspace", "ws"]) == 0
    tests = [json.loads(line) for line in (tmp_path / "ws" / "metrics.jsonl").read_text().splitlines()]
    losses = [record["loss"] for record in tests if record["phase"] == "test"]
    assert len(losses) == 2 and losses[1] < losses[0] - 0.5  # steps 0 and 40
    capfd.readouterr()
    code, out, _ = sample(capfd, conf, "ws", "--seed-text", "import ", "-n", "100")
    assert code == 0 and out.startswith(b"import ") and len(out) == 107
    assert set(out) <= set((tmp_path / "data" / "text" / "vocab.txt").read_bytes())


def test_synthetic_data_for_the_example_is_a_random_text_and_its_vocabulary(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = str(ROOT / "conf" / "char_rnn.conf")
    assert write_synthetic(conf, count=64) == ["data/text/vocab.txt", "data/text/input.txt"]
    folder = tmp_path / "data" / "text"
    text, vocab = (folder / "input.txt").read_bytes(), (folder / "vocab.txt").read_bytes()
    assert len(text) == 32 * (4 * 50 + 1)  # four windows in each of the 32 rows
    assert set(text) == set(vocab) and len(vocab) <= 97 and vocab == bytes(sorted(vocab))
    (folder / "input.txt").unlink()  # a vocabulary that exists is kept, the text drawn from it
    (folder / "vocab.txt").write_bytes(b"ab")
    assert write_synthetic(conf, count=64) == ["data/text/input.txt"]
    assert set((folder / "input.txt").read_bytes()) == set(b"ab")
    assert write_synthetic(conf) == []
