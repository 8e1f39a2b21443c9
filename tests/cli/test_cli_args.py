"""Option values the command line refuses before anything runs: one line on stderr, exit code 2, nothing
written (`--steps -5` once wrote step-5.h5, `--keep -1` deleted the only checkpoint, `--seed 2**70` and
unwritable output paths gave tracebacks); `--debug` (alias `--traceback`) shows the stack."""
from __future__ import annotations

import pathlib

import pytest

from singa_mpi import cli
from singa_mpi.errors import ConfigError, DataError

REPO = pathlib.Path(__file__).resolve().parents[2]
DIGITS = str(REPO / "conf" / "digits_mlp.conf")


def refused(capsys, *argv: str) -> str:
    """The one error line of ``singa-mpi ARGV``, which must exit with code 2 before running anything."""
    with pytest.raises(SystemExit) as exit_info:
        cli.main(list(argv))
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("option,value,expected", [
    ("--steps", "-5", "argument --steps: -5: expected an integer >= 0"),
    ("--steps", "ten", "argument --steps: 'ten': expected an integer"),
    ("--keep", "-1", "argument --keep: -1: expected a count of at least 1"),
    ("--stall-timeout", "-5", "argument --stall-timeout: -5: expected a finite number of seconds > 0"),
    ("--stall-timeout", "nan", "argument --stall-timeout: nan: expected a finite number of seconds > 0"),
    ("--stall-timeout", "inf", "argument --stall-timeout: inf: expected a finite number of seconds > 0"),
    ("--seed", str(2 ** 70), (f"argument --seed: {2 ** 70}: expected a seed between -9223372036854775808 and "
                             f"9223372036854775807 (64 bits)")),
    ("--seed", str(-2 ** 63 - 1), "expected a seed between"),
])
def test_train_values_are_refused_before_the_run(capsys, tmp_path, option, value, expected):
    workspace = tmp_path / "ws"
    line = refused(capsys, "train", DIGITS, "--workspace", str(workspace), option, value)
    assert line.startswith("singa-mpi train: error: ") and expected in line
    assert line.endswith("(see singa-mpi train -h)")
    assert not workspace.exists()


@pytest.mark.parametrize("value", [str(2 ** 63 - 1), str(-2 ** 63), "0"])
def test_every_int64_seed_is_a_seed(value):
    assert cli.job_seed(value) == int(value)


@pytest.mark.parametrize("argv,expected", [
    (["data", "synthetic", "--like", DIGITS, "--count", "-5"], "argument --count: -5: expected a count of at least 1"),
    (["data", "synthetic", "--like", DIGITS, "--classes", "0"],
     "argument --classes: 0: expected a count of at least 1"),
    (["data", "digits", "--out", "d", "--seed", "-1"], "argument --seed: -1: expected a seed >= 0"),
    (["sample", DIGITS, "--temperature", "0"], "argument --temperature: 0: expected a finite number > 0"),
    (["sample", DIGITS, "-n", "-3"], "argument -n: -3: expected an integer >= 0"),
    (["ckpt", "convert", "a.bin", "--out", "b.h5", "--step", "-2"], "argument --step: -2: expected an integer >= 0"),
])
def test_other_commands_refuse_bad_counts_and_seeds(capsys, argv, expected):
    line = refused(capsys, *argv)
    assert expected in line


def test_an_unknown_command_is_one_line_too(capsys):
    assert "argument COMMAND: invalid choice: 'trian'" in refused(capsys, "trian")


@pytest.mark.parametrize("argv, expected", [
    ([], "the following arguments are required: COMMAND (see singa-mpi -h)"),
    (["draw"], "the following arguments are required: WHAT (see singa-mpi draw -h)"),
    (["draw", "filt"], "argument WHAT: invalid choice: 'filt'"),
])
def test_a_missing_or_unknown_command_is_named_as_the_usage_names_it(capsys, argv, expected):
    """The usage says COMMAND (and draw's WHAT); the errors said argparse's inner names, "command" and
    "what", which no help text shows."""
    assert expected in refused(capsys, *argv)


# ------------------------------------------------------------------ outputs that cannot be written

@pytest.fixture
def below_a_file(tmp_path) -> pathlib.Path:
    """A path whose parent is a regular file: nothing can be created there (even by root)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    return blocker / "out"


@pytest.mark.parametrize("argv", [
    ["plan", DIGITS, "-n", "2", "-o", "{out}.txt"],
    ["data", "digits", "--out", "{out}"],
    ["data", "synthetic", "--like", DIGITS, "--out", "{out}"],
    ["ckpt", "convert", "a.bin", "--out", "{out}.h5"],
    ["train", DIGITS, "--trace", "{out}.json"],
    ["plot", "ws", "-o", "{out}.png"],
    ["draw", "filters", "c.h5", "-o", "{out}.png"],
    ["examples", "{out}"],
])
def test_unwritable_outputs_are_refused_before_anything_runs(capsys, below_a_file, argv):
    argv = [arg.replace("{out}", str(below_a_file)) for arg in argv]
    line = refused(capsys, *argv)
    assert f"{below_a_file}" in line and f"{below_a_file.parent} is a file, not a folder: expected a path below a " \
                                          f"folder" in line


def test_an_existing_folder_is_no_output_file(capsys, tmp_path):
    line = refused(capsys, "plan", DIGITS, "-n", "2", "-o", str(tmp_path))
    assert f"argument -o/--output: {tmp_path}: is a folder: expected a file name" in line


def test_a_writable_output_is_accepted(capsys, tmp_path):
    out = tmp_path / "new" / "plan.txt"  # its folder is made when written
    assert cli.writable_file(str(out)) == str(out)
    assert cli.main(["plan", DIGITS, "-n", "2", "-o", str(tmp_path / "plan.txt")]) == 0
    assert (tmp_path / "plan.txt").read_text().strip()


# ------------------------------------------------------------------ the library under the options

def test_synthetic_data_refuses_bad_counts_and_unwritable_stores(tmp_path):
    from singa_mpi.data.synthetic import write_synthetic

    with pytest.raises(ConfigError, match="^data synthetic: --count 0: expected at least 1$"):
        write_synthetic(DIGITS, count=0)
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    job = tmp_path / "job.conf"
    job.write_text(pathlib.Path(DIGITS).read_text().replace("data/digits/", f"{blocker}/digits/"))
    with pytest.raises(DataError) as err:
        write_synthetic(str(job), count=5)
    assert str(err.value) == (f"{job}:24:34: layer 'data': store_conf.path {blocker}/digits/train.h5: cannot write "
                              f"a synthetic store: Not a directory ({blocker}/digits): expected a path whose folders exist or "
                              f"can be made, on a file system you can write")


def test_digits_that_cannot_be_prepared_are_one_line(tmp_path):
    from singa_mpi.data.prepare import prepare_digits
    from singa_mpi.proto import job_pb2

    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    path = str(blocker / "digits" / "train.h5")
    with pytest.raises(DataError) as err:
        prepare_digits(path, job_pb2.StoreProto(backend="hdf5", path=path))
    assert f"cannot prepare scikit-learn's digits for {path}" in str(err.value)


# ------------------------------------------------------------------ --debug

@pytest.mark.parametrize("flag", ["--debug", "--traceback"])
def test_debug_shows_the_traceback(flag, tmp_path, capsys):
    """The traceback, then the line, with the error's own exit code (tests/cli/test_cli_debug.py)."""
    assert cli.main([flag, "check", str(tmp_path / "missing.conf")]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert "Traceback (most recent call last):" in err and "cannot read job configuration" in err


@pytest.mark.parametrize("argv", [["check", "{job}", "--debug"], ["check", "--traceback", "{job}"],
                                  ["ckpt", "inspect", "--debug", "{ckpt}"]])
def test_debug_after_the_command_too(argv, tmp_path, capsys):
    """Users type the flag where they type the others: after the command it was 'unrecognized'."""
    argv = [arg.format(job=tmp_path / "missing.conf", ckpt=tmp_path / "missing.h5") for arg in argv]
    assert cli.main(argv) in (ConfigError.exit_code, DataError.exit_code)
    assert "Traceback (most recent call last):" in capsys.readouterr().err
    assert cli.main(argv[:1] + [a for a in argv[1:] if a not in ("--debug", "--traceback")]) != 0
    assert "Traceback" not in capsys.readouterr().err  # without it: the line alone


def test_an_unknown_option_names_the_commands_help(capsys):
    assert refused(capsys, "check", DIGITS, "--bogus") == \
        "singa-mpi: error: unrecognized arguments: --bogus (see singa-mpi check -h)"


def test_without_debug_an_error_is_one_line(capsys, tmp_path):
    assert cli.main(["check", str(tmp_path / "missing.conf")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("singa-mpi: error: ") and "Traceback" not in err


def test_a_job_file_that_is_not_utf8_is_one_line(capsys, tmp_path):
    conf = tmp_path / "job.conf"
    conf.write_bytes(b"name: \"\xff\"\n")
    assert cli.main(["check", str(conf)]) == 2
    assert capsys.readouterr().err == (f"singa-mpi: error: {conf}: byte 8 (line 1): not UTF-8 text: expected a text "
                                       f"file in UTF-8 (0xff cannot start or continue a UTF-8 character here; a "
                                       f"binary file, or text in another encoding such as Latin-1?)\n")


# ------------------------------------------------------------------ check -n N refuses what train on N refuses

def test_check_on_n_workers_refuses_a_cluster_a_launch_on_n_refuses(capsys, tmp_path):
    """Co-located servers beyond the workers need more ranks: `train` on 2 refused them, `check -n 2` passed."""
    conf = tmp_path / "job.conf"
    conf.write_text(pathlib.Path(DIGITS).read_text().replace('cluster { workspace: "workspace/digits_mlp" }',
                                                             "cluster { nservers_per_group: 3 }"))
    assert cli.main(["check", "-n", "2", str(conf)]) == 2
    err = capsys.readouterr().err
    assert err == (f"singa-mpi: error: {conf}:68:1: 1 worker group(s) x 2 worker(s) with 3 co-located server(s) "
                   f"(cluster.nservers_per_group) need 3 ranks, checked for 2 (check -n 2): expected check -n 3 (and "
                   f"mpiexec -n 3 to train it)\n")  # check launches nothing: it said "launched with 2"
    assert cli.main(["check", "-n", "3", str(conf)]) == 0


def test_check_counts_ranks_as_run_does_and_plan_counts_workers_per_group(capsys):
    """`check -n N` and `plan -n N` were both "-n N, --workers N ... N workers", but check counts a launch's
    ranks (Downpour's 2 groups of 2 workers and its 2 servers: 6) where plan counts workers per group; check
    now takes --ranks, as run does, and each help says which it counts."""
    downpour = str(REPO / "conf" / "digits_downpour.conf")
    assert cli.main(["check", downpour, "--ranks", "6"]) == 0
    assert "plans on 2 worker(s) per group: train, test OK" in capsys.readouterr().out
    assert cli.main(["check", downpour, "--workers", "6"]) == 0  # the older name still works
    helps = {sub: parser.format_help() for sub, parser in cli.build_parser()._subparsers._group_actions[0]
             .choices.items()}
    assert "-n N, --ranks N" in helps["check"] and "N MPI ranks" in " ".join(helps["check"].split())
    assert "workers per group to plan for" in " ".join(helps["plan"].split())


def test_check_refuses_a_workspace_that_is_a_file_as_train_does(capsys, tmp_path, monkeypatch):
    """`check JOB` said OK to a cluster.workspace naming an existing file (only --print-workspace and
    train refused it): the run it passed then stopped at launch."""
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "job.conf"
    conf.write_text(pathlib.Path(DIGITS).read_text().replace('workspace: "workspace/digits_mlp"', 'workspace: "ws"'))
    (tmp_path / "ws").write_text("")
    assert cli.main(["check", str(conf)]) == 2
    assert capsys.readouterr().err == (f"singa-mpi: error: {conf}:68:11: cluster.workspace = ws: {tmp_path}/ws is "
                                       f"a file, not a folder: expected a folder for the run's checkpoints and logs "
                                       f"(move that file, or name another folder here or with --workspace)\n")


@pytest.mark.parametrize("written,shown", [("fc\\nb", "fc\\nb"), ("fc\u0085b", "fc\\x85b"), ("fc\u2028b", "fc\\u2028b")])
def test_a_name_with_a_line_break_stays_on_one_error_line(capsys, tmp_path, written, shown):
    """A layer named with a newline (an escape in the file), NEL or LINE SEPARATOR (UTF-8 in the file)
    is shown escaped: the error listing the known layers was two lines."""
    text = pathlib.Path(DIGITS).read_text().replace('name: "fc2"', f'name: "{written}"', 1)
    job = tmp_path / "job.conf"
    job.write_text(text, encoding="utf-8")
    assert cli.main(["check", str(job)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and shown in err, err


def test_a_job_bigger_than_memory_is_one_line_exit_6(tmp_path):
    """An allocation the machine refuses (here: 2 GiB of address space for a 96 GiB weight) is exit 6 and
    one line saying how much, for what, and what to do; it was a MemoryError traceback (exit 1)."""
    import subprocess
    import sys

    import nets

    data = nets.make_data(str(tmp_path / "data.h5"), 32, (12,), 5)
    job = tmp_path / "job.conf"
    job.write_text(nets.mlp(data, 8, "data", steps=2).replace("num_output: 16", "num_output: 2147483647", 1))
    capped = ("import resource, runpy, sys; resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30)); "
              "runpy.run_module('singa_mpi', run_name='__main__', alter_sys=True)")
    # --no-check-memory: the prediction before training refuses this job (tests/cost/test_memory.py); here the
    # allocation itself is refused, as for a job the prediction lets through
    proc = subprocess.run([sys.executable, "-c", capped, "train", str(job), "--workspace", str(tmp_path / "ws"),
                           "--no-check-memory"], cwd=REPO, capture_output=True, text=True, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 6 and len(lines) == 1, proc.stderr[-2000:]
    assert lines[0].startswith("singa-mpi: error: out of memory (Unable to allocate 96.0 GiB") and \
        "lower the batch size" in lines[0], lines[0]


@pytest.mark.parametrize("command", ["train", "test"])
@pytest.mark.parametrize("below", [False, True])
def test_a_job_whose_workspace_is_a_file_names_its_line(capsys, tmp_path, command, below):
    """cluster.workspace naming a regular file (or a folder below one) was refused naming the path alone,
    as if --workspace had named it; the job file's line and field say where to change it."""
    a_file = tmp_path / "afile"
    a_file.write_text("not a folder")
    workspace = a_file / "ws" if below else a_file
    text = pathlib.Path(DIGITS).read_text()
    lines = text.splitlines()
    row = next(i for i, line in enumerate(lines) if line.startswith("cluster {"))
    lines[row] = f'cluster {{ workspace: "{workspace}" }}'
    conf = tmp_path / "job.conf"
    conf.write_text("\n".join(lines) + "\n")
    assert cli.main([command, str(conf)]) == ConfigError.exit_code
    err = capsys.readouterr().err
    assert err == (f"singa-mpi: error: {conf}:{row + 1}:11: cluster.workspace = {workspace}: {a_file} is a file, "
                   f"not a folder: expected a folder for the run's checkpoints and logs (move that file, or name "
                   f"another folder here or with --workspace)\n")


@pytest.mark.parametrize("value", ["5GB", "4096MiB", "0", "-3", "1.5"])
def test_a_memory_limit_with_a_unit_or_below_one_mib_says_it_takes_whole_mib(capsys, value):
    line = refused(capsys, "plan", DIGITS, "-n", "2", "--auto", "--memory-limit", value)
    assert f"argument --memory-limit: {value!r}: expected a whole number of MiB, at least 1, without a unit " \
           f"(4096 for 4 GiB)" in line, line


@pytest.mark.parametrize("extra,expected", [
    (["--memory-limit", "100"], "--memory-limit 100: expected --auto beside it"),
    (["--cost", "--format", "json"], "--format json with --cost: expected --format text"),
    (["--auto", "--format", "dot"], "--format dot with --auto: expected --format text"),
    (["-o", "{tmp}/plan.png"], "-o {tmp}/plan.png: --format text writes text, not a .png picture: expected "
                               "--format dot to draw the plan, or a text file name"),
    (["--format", "json", "-o", "{tmp}/plan.SVG"], "--format json writes text, not a .svg picture"),
    (["--cost", "-o", "{tmp}/cost.pdf"], "--cost writes text, not a .pdf picture: expected a text file name"),
    (["--recalibrate"], "--recalibrate: expected --cost or --auto beside it"),
    (["--nodes", "2", "--format", "json"], "--nodes 2: expected --cost or --auto beside it"),
])
def test_plan_options_that_were_ignored_or_wrote_text_as_a_picture_are_one_line(capsys, tmp_path, extra, expected):
    """Each ran and exited 0: the memory limit, --recalibrate and --nodes of a plain plan and --cost's
    --format were ignored, and `-o plan.png` without --format dot wrote the text plan into plan.png."""
    argv = ["plan", DIGITS, "-n", "2", *[arg.replace("{tmp}", str(tmp_path)) for arg in extra]]
    assert cli.main(argv) == ConfigError.exit_code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and expected.replace("{tmp}", str(tmp_path)) in lines[0], captured.err
    assert captured.out == "" and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("argv,said", [
    (["trian"], "'trian' (choose from 'train', 'run', "),
    (["chekc", DIGITS], "'chekc' (choose from "),
    (["ckpt", "inspct", "a.h5"], "'inspct' (choose from 'inspect', 'convert') (did you mean 'inspect'?) (see singa-mpi ckpt -h)"),
    (["plan", DIGITS, "--phase", "tset"], "'tset' (choose from 'train', 'test', 'val') (did you mean 'test'?) (see "),
    (["data", "digit", "--out", "d"], "'digit' (choose from 'digits', "),
    (["plan", DIGITS, "--format", "jsn"], "'jsn' (choose from 'text', 'json', 'dot', 'program') (did you mean 'json'?)"),
])
def test_a_mistyped_choice_names_the_closest_valid_one(capsys, argv, said):
    """A mistyped command (or --phase, --format, ...) was refused with the list alone."""
    line = refused(capsys, *argv)
    assert f"invalid choice: {said}" in line
    closest = {"trian": "train", "chekc": "check", "digit": "digits"}.get(said.split("'")[1])
    if closest:
        assert line.endswith(f" (did you mean '{closest}'?) (see singa-mpi{' data' if closest == 'digits' else ''} -h)")
    else:
        assert "(did you mean '" in line


def test_a_choice_like_none_of_the_valid_ones_suggests_nothing(capsys):
    line = refused(capsys, "xyzzy")
    assert "invalid choice: 'xyzzy' (choose from 'train', " in line and "did you mean" not in line


def test_data_without_a_source_names_only_the_source_as_required(capsys):
    """argparse's intermixed parse (FILES may follow the options) said "required: source, FILES", but FILES
    is optional (data text's, default: the standard library's source)."""
    assert refused(capsys, "data") == ("singa-mpi data: error: the following arguments are required: source "
                                       "(see singa-mpi data -h)")
    assert refused(capsys, "data", "--out", "d") == ("singa-mpi data: error: the following arguments are required: "
                                                     "source (see singa-mpi data -h)")


@pytest.mark.parametrize("extra", [["--cost"], ["--auto"]])
def test_plan_over_more_nodes_than_ranks_is_one_line(capsys, extra):
    """`plan -n 2 --nodes 3 --cost` priced one rank per node without a word, as if a node were not there."""
    assert cli.main(["plan", DIGITS, "-n", "2", "--nodes", "3", *extra]) == ConfigError.exit_code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert lines[0].endswith("--nodes 3 with -n 2: more nodes than the 2 rank(s) to fill: expected --nodes at most "
                             "-n (each node holds at least one rank)"), lines[0]


def test_plan_over_more_nodes_than_the_job_s_workers_names_its_line(capsys):
    job = str(REPO / "conf" / "cifar10_hybrid.conf")
    assert cli.main(["plan", job, "--nodes", "3", "--cost"]) == ConfigError.exit_code
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and f"{job}:71:" in lines[0], lines
    assert "--nodes 3 with cluster.nworkers_per_group = 2: more nodes than the 2 rank(s)" in lines[0], lines[0]


def test_plan_cost_of_a_net_with_nothing_to_train_is_one_line(capsys):
    """A train net of inputs and a loss alone was priced (0.04 ms a step, 1.8 million samples/s) and
    trained, changing nothing; it is refused at its neuralnet's line, as check and train refuse it."""
    job = str(REPO / "tests" / "config" / "broken" / "bp_without_params.conf")
    assert cli.main(["plan", job, "-n", "2", "--cost"]) == ConfigError.exit_code
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and captured.out == "", captured
    assert f"{job}:6:1: neuralnet: the train net has nothing for kBP to train" in lines[0], lines[0]
