"""The README and the documentation pages are executed documentation: their commands, run in order in
a copy of the repository (tests/docs_commands.py says how, and which substitutions it makes), must
pass and do what the text next to them says."""
import pathlib
import re

import pytest

import docs_commands as dc

PAGES = dc.doc_files()


def page_id(page: pathlib.Path) -> str:
    return str(page.relative_to(dc.ROOT))


SAMPLE = """\
Intro.

```bash
pip install -e '.[plot]' && singa-mpi train   # trains -> workspace/digits_mlp/metrics.jsonl
singa-mpi data cifar10 --batches a.bin \\
    --out data/c.bin    # joined; it writes -> .../c.bin
# a comment line alone is no command
singa-mpi sample conf/char_rnn.conf --seed-text "def #x" -n 5   # a '#' inside quotes stays
```
<!-- docs test expects: output "done" -->
<!-- docs test expects: exit 2 -->

<!-- not run by the docs test: needs Slurm -->
```bash
sbatch slurm/train.sbatch
```

```python
print("not bash")
```

<!-- not run by the docs test -->

```bash
kill -USR1 <mpirun's pid>   # preempt (Open MPI's mpirun passes it)
```
<!-- docs test expects: file trace.json -->
"""


def test_extraction_finds_blocks_commands_skips_and_claims():
    blocks = dc.extract(SAMPLE)
    assert [(b.line, b.skip) for b in blocks] == [(3, None), (14, "needs Slurm"), (24, "")]
    first = blocks[0].commands
    assert [(c.line, c.text) for c in first] == [
        (4, "pip install -e '.[plot]' && singa-mpi train"),
        (5, "singa-mpi data cifar10 --batches a.bin --out data/c.bin"),
        (8, 'singa-mpi sample conf/char_rnn.conf --seed-text "def #x" -n 5')]
    assert first[0].files == ["workspace/digits_mlp/metrics.jsonl"] and first[0].exit == 0
    assert first[1].comment == "joined; it writes -> .../c.bin" and first[1].files == [".../c.bin"]
    assert first[2].comment == "a '#' inside quotes stays"
    assert (first[2].exit, first[2].outputs) == (2, ["done"])  # the HTML claims go to the block's last command
    assert blocks[1].commands[0].text == "sbatch slurm/train.sbatch"
    last = blocks[2].commands[0]
    assert (last.text, last.comment) == ("kill -USR1 <mpirun's pid>", "preempt (Open MPI's mpirun passes it)")
    assert last.files == ["trace.json"]


def test_arrows_that_name_no_file_are_no_claims():
    (block,) = dc.extract("```bash\nsinga-mpi plan j.conf   # 11.7 -> 9.9 ms; BlobProtos -> HDF5\n```\n")
    assert block.commands[0].files == []


def scratch(tmp_path) -> dc.Scratch:
    return dc.Scratch(tmp_path, {})


@pytest.mark.parametrize("typed,ran", [
    ("pip install -e '.[mpich]' && singa-mpi train", f"singa-mpi train --steps {dc.STEPS}"),
    ("pip install -e '.[plot]'", ""),
    ("python -m pytest tests/layers", "python -m pytest --collect-only -q tests/layers"),
    ("singa-mpi train conf/mnist_mlp.conf --workspace runs/mlp --seed 1 --steps 200",
     f"singa-mpi train conf/mnist_mlp.conf --workspace runs/mlp --seed 1 --steps {dc.STEPS}"),
    ("mpirun -n 2 python -m singa_mpi train --steps 2 --trace t.json",
     "mpirun -n 2 python -m singa_mpi train --steps 2 --trace t.json"),
    ("OMP_NUM_THREADS=2 singa-mpi train | tail -3", f"OMP_NUM_THREADS=2 singa-mpi train --steps {dc.STEPS} | tail -3"),
    ("singa-mpi test conf/digits_mlp.conf", "singa-mpi test conf/digits_mlp.conf"),
    ("python scripts/bench_scaling.py --ranks 1 2 --repeat 5",
     "python scripts/bench_scaling.py --ranks 1 2 --repeat 1 --steps 2 --nets mnist_mlp --schemes data"),
])
def test_substitutions(tmp_path, typed, ran):
    assert dc.substitute(typed, scratch(tmp_path)) == ran


def test_an_extra_that_pyproject_lacks_is_a_problem(tmp_path):
    s = scratch(tmp_path)
    dc.substitute("pip install -e '.[mpich,plots]'", s)
    assert len(s.problems) == 1 and "[plots]" in s.problems[0]


@pytest.mark.parametrize("text", ["sudo apt-get install openmpi-bin", "apt-get install -y graphviz",
                                  "pip install torch", "X=1 conda install graphviz", "bash scripts/slurm_selftest.sh",
                                  "sudo XDG_CACHE_HOME=/tmp/c scripts/two_nodes.sh -- singa-mpi calibrate"])
def test_commands_that_change_the_machine_are_never_run(tmp_path, text):
    result = dc.run_command(dc.Command(1, text), scratch(tmp_path))
    assert result.code == 0 and result.output == "" and "mark its block" in result.failures[0]


def test_a_command_that_fails_names_the_exit_code_and_a_missing_claimed_file(tmp_path):
    command = dc.Command(7, "echo hello; exit 3", files=["out.txt"], outputs=["hello", "bye"])
    result = dc.run_command(command, scratch(tmp_path))
    assert result.failures == ["exit 3, expected 0", "no file out.txt after it (the docs say it writes it)",
                               '"bye" not in its output']
    assert "README.md:7: echo hello; exit 3" in dc.report("README.md", [result], [])


def test_job_files_test_at_most_a_few_batches(tmp_path):
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "j.conf").write_text("train_steps: 1000\ntest_steps: 100\nvalidate_steps:1\n")
    dc.substitute("singa-mpi check conf/j.conf", scratch(tmp_path))
    assert (tmp_path / "conf" / "j.conf").read_text() == \
        f"train_steps: 1000\ntest_steps: {dc.TEST_STEPS}\nvalidate_steps:1\n"


def test_a_missing_checkpoint_step_names_the_newest(tmp_path):
    (tmp_path / "ws" / "checkpoint").mkdir(parents=True)
    for step in (4, 12):
        (tmp_path / "ws" / "checkpoint" / f"step{step}.h5").touch()
    assert dc.substitute("singa-mpi ckpt inspect ws/checkpoint/step600.h5", scratch(tmp_path)) == \
        "singa-mpi ckpt inspect ws/checkpoint/step12.h5"


def test_every_substitution_in_the_table_is_implemented_and_every_quick_script_exists():
    assert [row.name for row in dc.SUBSTITUTIONS] == list(dc.RULES)
    assert all((dc.ROOT / "scripts" / name).exists() for name in dc.QUICK_FLAGS)
    assert all((dc.ROOT / "conf" / f"{job}.conf").exists() for job in dc.SYNTHETIC_JOBS)


def test_pages_come_in_the_navs_order_after_the_readme(tmp_path):
    (tmp_path / "docs" / "topics").mkdir(parents=True)
    for name in ("README.md", "docs/index.md", "docs/b.md", "docs/topics/a.md", "docs/orphan.md"):
        (tmp_path / name).write_text("x\n")
    (tmp_path / "mkdocs.yml").write_text("site_name: x\nnav:\n  - Home: index.md\n  - Topics:\n"
                                         "      - topics/a.md\n  - B: b.md\ntheme: mkdocs\n")
    assert [str(p.relative_to(tmp_path)) for p in dc.doc_files(tmp_path)] == [
        "README.md", "docs/index.md", "docs/topics/a.md", "docs/b.md", "docs/orphan.md"]


@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_every_skipped_block_says_why(page):
    blocks = dc.extract(page.read_text())
    assert [b.line for b in blocks if b.skip == ""] == [], f"{page_id(page)}: blocks not run without a reason"
    for block in blocks:
        for command in block.commands:
            assert not re.search(r"docs test expects", command.comment), f"{page_id(page)}:{command.line}"


@pytest.mark.parametrize("page", PAGES + sorted((dc.ROOT / "conf").glob("*.conf")), ids=page_id)
def test_the_generic_launch_is_mpiexec(page):
    """The pages and the example jobs' comments showed `mpirun -n` in places and `mpiexec -n` in others,
    where plan and the notes say `mpiexec -n` (the MPI standard's name, which MPICH and Open MPI both
    install): `mpirun -n` only where the line is about Open MPI's."""
    assert generic_mpirun_lines(page) == []


def test_the_python_examples_and_the_package_say_mpiexec_too():
    """Their docstrings (the Python examples' usage lines, the API's) said `mpirun -n` after the pages
    had changed."""
    files = sorted((dc.ROOT / "examples" / "python").glob("*.py")) + sorted((dc.ROOT / "singa_mpi").rglob("*.py"))
    assert [line for path in files for line in generic_mpirun_lines(path)] == []


def generic_mpirun_lines(page: pathlib.Path) -> list[str]:
    return [f"{page_id(page)}:{number}: {line.strip()}" for number, line in enumerate(page.read_text().splitlines(), 1)
            if re.search(r"\bmpirun -n\b", line) and "Open MPI" not in line]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("page", PAGES, ids=page_id)
def test_the_commands_of_the_page_work_in_order(page, tmp_path):
    results, skipped = dc.run_page(page, tmp_path / "clone")
    text = dc.report(page_id(page), results, skipped)
    print(text)
    assert not any(r.failures for r in results), text
