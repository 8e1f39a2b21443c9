"""The documentation's shell commands, extracted and run in order as a new user would run them.

Every command of a ```bash block in README.md and docs/*.md (README first, then the pages in
mkdocs.yml's ``nav`` order, then any page the nav leaves out, sorted) runs in its own ``bash -c``, in
order, in a scratch folder per file that is a copy of the repository (the files ``git ls-files``
lists, plus untracked ones git does not ignore: what a clone holds once the work is committed).
The table SUBSTITUTIONS just below is the only difference between what runs and what a user
types: it shortens runs, fills placeholders with files made here and keeps the user's caches out.

How a page talks to this test (tests/end_to_end/test_docs_commands.py checks that it parses):

* a ```bash block whose previous non-blank line is ``<!-- not run by the docs test: REASON -->`` is
  skipped and reported with its reason;
* lines ending in a backslash are joined; ``# comments`` are cut off before running; a comment's
  ``-> PATH`` is a claim: PATH exists after the command (``.../NAME``: NAME below one of the
  command's folder arguments);
* HTML comments right after a block's closing fence are claims about the block's last command:
  ``<!-- docs test expects: file PATH -->``, ``<!-- docs test expects: output "TEXT" -->`` (in its
  stdout or stderr), ``<!-- docs test expects: exit N -->`` (default 0).
* each command starts from a fresh shell: ``cd`` and ``export`` do not carry to the next line (join
  such lines with ``&&``, or mark the block not run);
* commands that would change the machine or the environment (NEVER_RUN: sudo, package managers, pip
  installs of other packages, scripts/slurm_selftest.sh, scripts/two_nodes.sh) are never run; in a
  block not marked, they fail, asking for the marker.

Run by hand, one file at a time (prints each command with its time and exit code)::

    python tests/docs_commands.py README.md [--keep DIR]
"""
from __future__ import annotations

import dataclasses
import gzip
import os
import pathlib
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable

ROOT = pathlib.Path(__file__).resolve().parents[1]
STEPS = 4  # training steps of a shortened run
TEST_STEPS = 2  # test and validation batches of a pass
TIMEOUT_S = 240  # per command


@dataclasses.dataclass(frozen=True)
class Substitution:
    name: str  # the function below that does it
    docs_say: str
    test_runs: str
    why: str


# ---------------------------------------------------------------------------------------------------
# THE TABLE: the only differences between what the docs print and what this test runs.
SUBSTITUTIONS = (
    Substitution("environment", "the user's shell (a virtual environment activated)",
                 "PATH starts with this Python's bin folder (its singa-mpi, python, MPICH mpirun/mpiexec); "
                 "OMP_NUM_THREADS, OPENBLAS_NUM_THREADS and MKL_NUM_THREADS unset; UCX_TLS=self,sm unless set; "
                 "XDG_CACHE_HOME in the scratch folder",
                 "a user's shell sets no thread count; UCX as every MPI test sets it (launchers.py); "
                 "calibrate and the kernel timings must not overwrite the user's cache"),
    Substitution("short_tests", "the job files' test_steps and validate_steps",
                 f"at most {TEST_STEPS} in the scratch copy's job files (conf/, examples/)",
                 "time: a shortened run still tests at step 0 and at its end (CIFAR-10's 100 test batches "
                 "cost more than the rest of the run)"),
    Substitution("pip_install", "pip install -e '.[EXTRAS]' (alone, or before &&)",
                 "not run; each EXTRA must be an optional-dependency of pyproject.toml",
                 "the test runs in the environment it was installed into, without a network"),
    Substitution("pytest_collects", "python -m pytest [ARGS]", "python -m pytest --collect-only -q [ARGS]",
                 "CI runs the suite itself; collecting checks the paths and that the test tools import"),
    Substitution("short_training", "singa-mpi / python -m singa_mpi ... train [--steps N]",
                 f"the same with --steps {STEPS} (N above {STEPS} lowered to {STEPS})", "time"),
    Substitution("one_repeat", "--repeat N", "--repeat 1", "time"),
    Substitution("quick_scripts", "python scripts/NAME.py [ARGS]",
                 "the same with NAME's flags of QUICK_FLAGS (replacing the docs' values of those flags)",
                 "time; the flags are those the suite's smoke tests use"),
    Substitution("newest_checkpoint", "WORKSPACE/checkpoint/stepN.h5 (not there)",
                 "WORKSPACE's newest checkpoint", "the shortened runs stop before step N"),
    Substitution("placeholder_files", "the names of PLACEHOLDER_FILES (JOB.conf, mydata.csv, MNIST IDX "
                 "files, CIFAR-10 batches, SINGA BlobProtos and the job that wrote them)",
                 "those files, made here before the first command that names them",
                 "the user brings them; the test makes small ones"),
    Substitution("synthetic_data", "train/test/draw of a job on MNIST or CIFAR-10 (SYNTHETIC_JOBS)",
                 "first `singa-mpi data synthetic --like conf/JOB.conf` (it leaves existing stores alone)",
                 "no data set is downloaded; the docs say to convert your own copy"),
)

QUICK_FLAGS = {  # script: flags that make it quick (each replaces the docs' value of that flag)
    "rbm_chain.py": {"--steps": "8"},
    "bench_serial.py": {"--steps": "3"},
    "bench_threads.py": {"--repeat": "1", "--jobs": "digits_mlp", "--settings": "env=1 default"},
    "bench_scaling.py": {"--steps": "2", "--repeat": "1", "--nets": "mnist_mlp", "--schemes": "data"},
    "bench_cost.py": {"--nets": "mnist_mlp", "--schemes": "data", "--repeat": "1", "--steps": "3"},
    "bench_frameworks.py": {"--nets": "mnist_mlp", "--steps": "20", "--repeat": "1", "--target": "0.2"},
    "bench_peer.py": {"--repeat": "1", "--steps": "4"},
    "bench_rbm.py": {"--epochs": "1", "--hidden": "8", "--batch": "50", "--ranks": "1", "--repeat": "1"},
    "bench_gru.py": {"--hidden": "16", "--batch": "4", "--unroll": "5", "--steps": "3", "--warmup": "2",
                     "--repeat": "1", "--max-bytes": "20000"},
    "bench_trace.py": {"--steps": "3", "--rounds": "1"},
    "profile_step.py": {"--steps": "3"},
    "profile_convnet.py": {"--steps": "2"},
}

SYNTHETIC_JOBS = ("mnist_mlp", "mnist_conv", "cifar10_convnet", "cifar10_hybrid", "rbm_mnist_1", "rbm_mnist_2",
                  "rbm_mnist_3", "rbm_mnist_4", "rbm_mnist_autoencoder")
# PLACEHOLDER_FILES (name -> maker) is defined below its makers.
# ---------------------------------------------------------------------------------------------------

# Never run, marked or not: they change the machine (packages, daemons, network namespaces, as root)
# or the environment the test runs in.  An unmarked one fails, asking for the not-run marker.
NEVER_RUN = re.compile(r"(?:^|[;&|]\s*)(?:\w+=\S*\s+)*(?:sudo|apt-get|apt|yum|dnf|brew|conda|pip3?)\s"
                       r"|scripts/slurm_selftest\.sh|scripts/two_nodes\.sh")


@dataclasses.dataclass
class Command:
    line: int  # 1-based line of the command's first line in its file
    text: str  # continuation lines joined, comment cut off
    comment: str = ""
    exit: int = 0
    files: list[str] = dataclasses.field(default_factory=list)
    outputs: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Block:
    line: int  # the opening fence's line
    commands: list[Command]
    skip: str | None = None  # the reason, when the block is not run ("" when the marker gives none)


FENCE = re.compile(r"^\s*(`{3,}|~{3,})\s*([\w+-]*)")
SKIP = re.compile(r"^\s*<!--\s*not run by the docs test\b:?\s*(.*?)\s*-->\s*$")
EXPECT = re.compile(r"^\s*<!--\s*docs test expects:\s*(file|output|exit)\s+(.*?)\s*-->\s*$")
ARROW = re.compile(r"->\s*(\S+)")


def extract(markdown: str) -> list[Block]:
    """The ```bash blocks of a page, their commands and claims."""
    lines = markdown.splitlines()
    blocks, i = [], 0
    while i < len(lines):
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        start, mark = i, fence.group(1)
        i += 1
        while i < len(lines) and not (lines[i].strip().startswith(mark) and not lines[i].strip().strip(mark[0])):
            i += 1
        end, i = i, i + 1
        if fence.group(2) != "bash":
            continue
        before = next((line for line in reversed(lines[:start]) if line.strip()), "")
        skip = SKIP.match(before)
        block = Block(start + 1, _commands(lines[start + 1:end], start + 2), skip.group(1) if skip else None)
        while i < len(lines) and (not lines[i].strip() or EXPECT.match(lines[i])):
            expect = EXPECT.match(lines[i])
            if expect and block.commands:
                _add_claim(block.commands[-1], expect.group(1), expect.group(2))
            i += 1
        blocks.append(block)
    return blocks


def _commands(lines: list[str], first_line: int) -> list[Command]:
    commands, pending, pending_line = [], "", 0
    for number, line in enumerate(lines, first_line):
        if not pending:
            pending_line = number
        stripped = line.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1].rstrip() + " "
            continue
        text, comment = split_comment((pending + line.strip()).strip())
        pending = ""
        if text:
            command = Command(pending_line, text, comment)
            for claim in ARROW.findall(comment):
                if "/" in claim or re.search(r"\.[A-Za-z]\w*$", claim):
                    command.files.append(claim.rstrip(",;)"))
            commands.append(command)
    return commands


def _add_claim(command: Command, kind: str, value: str) -> None:
    if kind == "file":
        command.files.append(value)
    elif kind == "output":
        command.outputs.append(value[1:-1] if value[:1] == value[-1:] == '"' else value)
    else:
        command.exit = int(value)


def split_comment(text: str) -> tuple[str, str]:
    """(command, comment): a ``#`` that starts a word outside quotes starts the comment (an apostrophe
    inside a word, as in a placeholder ``<mpirun's pid>``, is no quote)."""
    quote = None
    for k, ch in enumerate(text):
        if quote:
            quote = None if ch == quote else quote
        elif ch == "'" and 0 < k < len(text) - 1 and text[k - 1].isalnum() and text[k + 1].isalnum():
            continue
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (k == 0 or text[k - 1].isspace()):
            return text[:k].rstrip(), text[k + 1:].strip()
    return text, ""


# ------------------------------------------------------------------ which files, in which order

def doc_files(root: pathlib.Path = ROOT) -> list[pathlib.Path]:
    """README.md, then docs/*.md in mkdocs.yml's nav order, then the pages the nav leaves out."""
    docs = root / "docs"
    pages = sorted(docs.glob("**/*.md")) if docs.is_dir() else []
    ordered = []
    mkdocs = root / "mkdocs.yml"
    if mkdocs.exists():
        nav = re.search(r"^nav:\s*\n((?:[ \t-].*\n?|\s*\n)*)", mkdocs.read_text(), re.M)
        for name in re.findall(r"([\w./-]+\.md)\b", nav.group(1) if nav else ""):
            page = docs / name
            if page in pages and page not in ordered:
                ordered.append(page)
    readme = [root / "README.md"] if (root / "README.md").exists() else []
    return readme + ordered + [p for p in pages if p not in ordered]


# ------------------------------------------------------------------ the substitutions

@dataclasses.dataclass
class Scratch:
    """A copy of the repository where one page's commands run, and what has been made there."""
    folder: pathlib.Path
    env: dict[str, str]
    made: set[str] = dataclasses.field(default_factory=set)
    problems: list[str] = dataclasses.field(default_factory=list)  # found by a substitution itself


RULES: dict[str, Callable[[str, Scratch], str]] = {}


def rule(function: Callable[[str, Scratch], str]) -> Callable[[str, Scratch], str]:
    RULES[function.__name__] = function
    return function


def substitute(text: str, scratch: Scratch) -> str:
    """The command as this test runs it: SUBSTITUTIONS applied in the table's order."""
    for row in SUBSTITUTIONS:
        text = RULES[row.name](text, scratch)
    return text


@rule
def environment(text: str, scratch: Scratch) -> str:
    env = scratch.env
    for name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env.pop(name, None)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")
    env.setdefault("UCX_TLS", "self,sm")
    env["XDG_CACHE_HOME"] = str(scratch.folder / ".cache")
    return text


@rule
def short_tests(text: str, scratch: Scratch) -> str:
    if "short_tests" not in scratch.made:
        scratch.made.add("short_tests")
        for job in [*scratch.folder.glob("conf/*.conf"), *scratch.folder.glob("examples/**/*.conf")]:
            if not job.is_symlink():
                job.write_text(re.sub(r"\b((?:test|validate)_steps\s*:\s*)(\d+)",
                                      lambda m: m.group(1) + str(min(int(m.group(2)), TEST_STEPS)), job.read_text()))
    return text


PIP = re.compile(r"\bpip3?\s+install\s+(?:-e\s+)?(['\"]?)(?:\.|singa_mpi)(?:\[([\w,\s-]*)\])?\1(?:\s*&&\s*|\s*$)")


@rule
def pip_install(text: str, scratch: Scratch) -> str:
    for match in PIP.finditer(text):
        known = optional_dependencies()
        for extra in filter(None, (e.strip() for e in (match.group(2) or "").split(","))):
            if extra not in known:
                scratch.problems.append(f"extra [{extra}] is not in pyproject.toml (it has: {', '.join(known)})")
    return PIP.sub("", text).strip()


def optional_dependencies(root: pathlib.Path = ROOT) -> list[str]:
    section = re.search(r"^\[project\.optional-dependencies\]\n(.*?)(?=^\[|\Z)", (root / "pyproject.toml").read_text(),
                        re.M | re.S)
    return re.findall(r"^([\w-]+)\s*=", section.group(1), re.M) if section else []


@rule
def pytest_collects(text: str, scratch: Scratch) -> str:
    return re.sub(r"\b(python3? -m pytest)\b", r"\1 --collect-only -q", text)


SHELL_OPERATOR = re.compile(r"\s(?:\|\|?|&&|;|\d?>>?)\s")


def with_flags(text: str, anchor: re.Match, flags: dict[str, str]) -> str:
    """``text`` with each flag of ``flags`` set to its value in the program call that ``anchor`` ends
    (up to the next shell operator): the docs' value replaced in place, else the flag appended."""
    stop = SHELL_OPERATOR.search(text, anchor.end())
    end = stop.start() if stop else len(text)
    call = text[anchor.end():end]
    for flag, value in flags.items():
        given = re.compile(rf"\s{re.escape(flag)}(?:=\S+|(?:\s+(?!-)\S+)*)")
        call = _replace_first(given, call, f" {flag} {value}") if given.search(call) else call + f" {flag} {value}"
    return text[:anchor.end()] + call + text[end:]


def _replace_first(pattern: re.Pattern, text: str, replacement: str) -> str:
    """The first match replaced, any later ones removed."""
    first = pattern.search(text)
    return text[:first.start()] + replacement + pattern.sub("", text[first.end():])


@rule
def short_training(text: str, scratch: Scratch) -> str:
    train = re.search(r"(?:\bsinga-mpi|-m singa_mpi)(?:\s+--?[\w-]+)*\s+train\b", text)
    if not train:
        return text
    stop = SHELL_OPERATOR.search(text, train.end())
    given = re.search(r"--steps[\s=]+(\d+)", text[train.end():stop.start() if stop else len(text)])
    if given and int(given.group(1)) <= STEPS:
        return text
    return with_flags(text, train, {"--steps": str(STEPS)})


@rule
def one_repeat(text: str, scratch: Scratch) -> str:
    return re.sub(r"--repeat([\s=]+)\d+", r"--repeat\g<1>1", text)


@rule
def quick_scripts(text: str, scratch: Scratch) -> str:
    for script, flags in QUICK_FLAGS.items():
        anchor = re.search(rf"\bscripts/{re.escape(script)}", text)
        if anchor:
            text = with_flags(text, anchor, flags)
    return text


@rule
def newest_checkpoint(text: str, scratch: Scratch) -> str:
    def newest(match: re.Match) -> str:
        if (scratch.folder / match.group(0)).exists():
            return match.group(0)
        found = sorted((scratch.folder / match.group(1)).glob("step*.h5"),
                       key=lambda p: int(re.sub(r"\D", "", p.stem) or 0))
        return match.group(1) + found[-1].name if found else match.group(0)
    return re.sub(r"(\S*/checkpoint/)step\d+\.h5", newest, text)


@rule
def placeholder_files(text: str, scratch: Scratch) -> str:
    for name, make in PLACEHOLDER_FILES.items():
        if name in text and name not in scratch.made:
            scratch.made.add(name)
            if not (scratch.folder / name).exists():
                make(scratch.folder)
    return text


@rule
def synthetic_data(text: str, scratch: Scratch) -> str:
    jobs = "|".join(SYNTHETIC_JOBS)
    for job in re.findall(rf"\b(?:train|test|draw\s+reconstructions)\b.*?\bconf/({jobs})\.conf\b", text):
        if job not in scratch.made:
            scratch.made.add(job)
            done = subprocess.run(["singa-mpi", "data", "synthetic", "--like", f"conf/{job}.conf"], cwd=scratch.folder,
                                  env=scratch.env, capture_output=True, text=True, timeout=TIMEOUT_S)
            if done.returncode:
                scratch.problems.append(f"data synthetic --like conf/{job}.conf: exit {done.returncode}: "
                                        f"{(done.stdout + done.stderr)[-1000:]}")
    return text


# ------------------------------------------------------------------ the placeholder files

def _idx(path: pathlib.Path, magic: int, data) -> None:
    import numpy as np

    header = np.array([magic, *data.shape], ">u4").tobytes()
    path.write_bytes(gzip.compress(header + data.astype(np.uint8).tobytes()))


def make_mnist(folder: pathlib.Path) -> None:
    """200 random 28x28 images and their labels (MNIST's IDX format, gzipped)."""
    import numpy as np

    rng = np.random.default_rng(0)
    _idx(folder / "train-images-idx3-ubyte.gz", 2051, rng.integers(0, 256, (200, 28, 28)))
    _idx(folder / "train-labels-idx1-ubyte.gz", 2049, rng.integers(0, 10, 200))


def make_cifar10(folder: pathlib.Path) -> None:
    """CIFAR-10's five binary training batches of 40 records (label byte, 3x32x32 bytes) each."""
    import numpy as np

    rng = np.random.default_rng(0)
    (folder / "cifar-10-batches-bin").mkdir(exist_ok=True)
    for k in range(1, 6):
        records = rng.integers(0, 256, (40, 3073))
        records[:, 0] %= 10
        (folder / "cifar-10-batches-bin" / f"data_batch_{k}.bin").write_bytes(records.astype(np.uint8).tobytes())


def make_csv(folder: pathlib.Path) -> None:
    """100 lines ``label,v1,...,v8``."""
    import numpy as np

    rng = np.random.default_rng(0)
    lines = [",".join([str(rng.integers(10))] + [f"{v:.4f}" for v in rng.random(8)]) for _ in range(100)]
    (folder / "mydata.csv").write_text("\n".join(lines) + "\n")


def make_job(folder: pathlib.Path) -> None:
    """A copy of the default job, conf/digits_mlp.conf."""
    shutil.copy(folder / "conf" / "digits_mlp.conf", folder / "JOB.conf")


def make_blobprotos(folder: pathlib.Path) -> None:
    """SINGA 0.x checkpoints of two workers, each holding half the rows of w1 and all of b1."""
    from singa_mpi.proto import job_pb2

    for worker in (0, 1):
        blobs = job_pb2.BlobProtos(name=["0#w1", "0#b1"], version=[6000, 6000])
        blobs.blob.add(shape=[2, 3], data=[0.5 * worker + k for k in range(6)])
        blobs.blob.add(shape=[2], data=[1.0, 2.0])
        (folder / f"step6000-worker{worker}").write_bytes(blobs.SerializeToString())


RBM1_JOB = """\
# the SINGA job that wrote step6000-worker0 and -worker1 (make_blobprotos): fc1 split on its 4 outputs
name: "rbm1"
train_steps: 6000
train_one_batch { alg: kBP }
updater { type: kSGD learning_rate { type: kFixed base_lr: 0.1 } }
neuralnet {
  layer { name: "data" type: kRecordInput store_conf { backend: "hdf5" path: "train.h5" batchsize: 8 shape: 3 } }
  layer { name: "fc1" type: kInnerProduct srclayers: "data" partition_dim: 1 innerproduct_conf { num_output: 4 }
          param { name: "w1" init { type: kGaussian std: 0.1 } } param { name: "b1" init { type: kConstant } } }
  layer { name: "loss" type: kSoftmaxLoss srclayers: "fc1" srclayers: "data" }
}
cluster { nworkers_per_group: 2 }
"""


def make_rbm1_job(folder: pathlib.Path) -> None:
    """The job that wrote make_blobprotos's files: `ckpt convert --job` joins their parts to its shapes."""
    (folder / "rbm1.conf").write_text(RBM1_JOB)


PLACEHOLDER_FILES = {
    "JOB.conf": make_job,
    "mydata.csv": make_csv,
    "train-images-idx3-ubyte.gz": make_mnist,
    "train-labels-idx1-ubyte.gz": make_mnist,
    "cifar-10-batches-bin/": make_cifar10,
    "step6000-worker0": make_blobprotos,
    "rbm1.conf": make_rbm1_job,
}


# ------------------------------------------------------------------ running a page

def copy_repository(target: pathlib.Path, root: pathlib.Path = ROOT) -> None:
    """What a clone holds: ``git ls-files`` (and untracked files git does not ignore); outside a git
    checkout, the folders the docs' commands use."""
    try:
        listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=root,
                                capture_output=True, check=True, timeout=60).stdout.decode().split("\0")
    except (OSError, subprocess.SubprocessError):
        listed = [str(p.relative_to(root)) for d in ("conf", "examples", "scripts", "slurm") if (root / d).is_dir()
                  for p in (root / d).rglob("*") if not p.is_dir()]
    for name in filter(None, listed):
        source, dest = root / name, target / name
        if not os.path.lexists(source):
            continue  # deleted in the working tree
        dest.parent.mkdir(parents=True, exist_ok=True)
        if source.is_symlink():
            os.symlink(os.readlink(source), dest)
        elif source.is_file():
            shutil.copy2(source, dest)


@dataclasses.dataclass
class Result:
    command: Command
    ran: str  # the command after the substitutions
    code: int | None  # None: timed out
    seconds: float  # wall time
    cpu: float  # CPU seconds of the command and all its processes (on a busy machine: its real cost)
    output: str
    failures: list[str]


def run_command(command: Command, scratch: Scratch, timeout: float = TIMEOUT_S) -> Result:
    scratch.problems = []
    start, cpu = time.monotonic(), _children_cpu()  # the substitutions' own work (data synthetic) counts
    ran = substitute(command.text, scratch)
    code, output = 0, ""
    if NEVER_RUN.search(ran):
        scratch.problems.append("not run: it would change this machine or this environment; mark its block "
                                "<!-- not run by the docs test: REASON -->")
    elif ran:
        process = subprocess.Popen(["bash", "-c", ran], cwd=scratch.folder, env=scratch.env, stdout=subprocess.PIPE,
                                   stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
        try:
            output, _ = process.communicate(timeout=timeout)
            code = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            output, code = process.communicate()[0], None
    seconds, cpu = time.monotonic() - start, _children_cpu() - cpu
    failures = list(scratch.problems)
    if code is None:
        failures.append(f"did not end within {timeout:.0f} s")
    elif code != command.exit:
        failures.append(f"exit {code}, expected {command.exit}")
    for path in command.files:
        if not _claimed_file_exists(path, ran, scratch.folder):
            failures.append(f"no file {path} after it (the docs say it writes it)")
    failures += [f'"{text}" not in its output' for text in command.outputs if text not in output]
    return Result(command, ran, code, seconds, cpu, output, failures)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _claimed_file_exists(path: str, command: str, folder: pathlib.Path) -> bool:
    if not path.startswith(".../"):
        return (folder / path).exists()
    return any((folder / arg / path[4:]).exists() for arg in command.split() if (folder / arg).is_dir())


def run_page(page: pathlib.Path, folder: pathlib.Path, root: pathlib.Path = ROOT,
             echo: Callable[[Result], None] | None = None) -> tuple[list[Result], list[Block]]:
    """Every command of ``page`` in order, in ``folder`` (a fresh copy of ``root``); the results and
    the blocks skipped."""
    copy_repository(folder, root)
    scratch = Scratch(folder, dict(os.environ))
    blocks = extract(page.read_text())
    results = []
    for block in blocks:
        if block.skip is not None:
            continue
        for command in block.commands:
            results.append(run_command(command, scratch))
            if echo:
                echo(results[-1])
    return results, [b for b in blocks if b.skip is not None]


def report(page: str, results: list[Result], skipped: list[Block], tail: int = 20) -> str:
    """What failed (file:line, the command as typed and as run, why, the output's tail), then the
    skipped blocks with their reasons and every command's time."""
    out = []
    for r in results:
        if r.failures:
            out.append(f"{page}:{r.command.line}: {r.command.text}")
            if r.ran != r.command.text:
                out.append(f"    ran: {r.ran}")
            out += [f"    {f}" for f in r.failures]
            out += [f"    | {line}" for line in r.output.rstrip().splitlines()[-tail:]]
    out.append(f"{sum(bool(r.failures) for r in results)} of {len(results)} commands failed; "
               f"{sum(r.seconds for r in results):.0f} s in all ({sum(r.cpu for r in results):.0f} CPU s)")
    out += [f"skipped: {page}:{b.line}: {b.skip or '(no reason given)'}" for b in skipped]
    out += [f"  {r.seconds:6.1f} s {r.cpu:6.1f} CPU s  {page}:{r.command.line}: {r.ran or '(nothing to run)'}"
            for r in results]
    return "\n".join(out)


def main(argv: list[str]) -> int:
    import argparse

    parser = argparse.ArgumentParser(description="run one documentation page's commands, as the docs test does")
    parser.add_argument("page", help="README.md or docs/PAGE.md")
    parser.add_argument("--keep", help="run in this (new) folder and keep it")
    args = parser.parse_args(argv)
    folder = pathlib.Path(args.keep or tempfile.mkdtemp(prefix="docs_commands_"))
    folder.mkdir(parents=True, exist_ok=True)

    def echo(r: Result) -> None:
        mark = "ok " if not r.failures else "FAIL"
        print(f"{mark} {r.seconds:6.1f} s {r.cpu:6.1f} CPU s  line {r.command.line}: {r.ran or '(nothing to run)'}"
              + "".join(f"\n       {f}" for f in r.failures), flush=True)

    try:
        results, skipped = run_page(ROOT / args.page, folder, echo=echo)
        print(report(args.page, results, skipped))
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 1 if any(r.failures for r in results) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
