"""SINGA's deep autoencoder, end to end: RBMs 1-4 by contrastive divergence, then BP fine-tuning.

    python scripts/rbm_chain.py                       # scikit-learn's digits, about 10 s on one core
    python scripts/rbm_chain.py -n 2                  # every job on 2 ranks (mpiexec -n 2)
    python scripts/rbm_chain.py --set mnist           # SINGA's sizes; needs data/mnist/{train,test}.h5
    python scripts/rbm_chain.py --steps 20            # a short version of every job (a smoke test)

Runs ``conf/rbm_<set>_1.conf`` ... ``rbm_<set>_4.conf`` and ``rbm_<set>_autoencoder.conf`` in order,
in the folder you run it from (their workspaces are ``workspace/rbm_<set>_*``; each job loads the
checkpoints of the ones before it through ``checkpoint_path``; ``--overwrite`` is passed, so a rerun
starts afresh).  Prints each job's final test reconstruction error, per held-out instance: the sum of
squared errors over its inputs (an RBM's ``squared_error``; for the autoencoder, twice its Euclidean
``loss``, which is half that sum), and ends with the autoencoder's.  Exit code: the first failing
job's, else 0.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from singa_mpi.cli import EXAMPLES, resolve_workspace
from singa_mpi.communication.launchers import LauncherNotFound, find_launcher
from singa_mpi.config.load import load_job

STAGES = ["1", "2", "3", "4", "autoencoder"]


def command(conf: str, ranks: int, steps: int | None, extra: list[str]) -> list[str]:
    if ranks > 1:
        try:
            launch = find_launcher().command(ranks)  # SINGA_MPI_FLAVOR=openmpi|mpich
        except LauncherNotFound as err:
            sys.exit(f"rbm_chain: {err}")
    else:
        launch = []
    words = launch + [sys.executable, "-m", "singa_mpi", "train", conf, "--overwrite"]
    return words + (["--steps", str(steps)] if steps is not None else []) + extra


def final_test_error(workspace: str) -> tuple[int, float] | None:
    """(step, per-instance sum of squared errors) of the last test entry in metrics.jsonl."""
    path = os.path.join(workspace, "metrics.jsonl")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        tests = [entry for entry in map(json.loads, f) if entry.get("phase") == "test"]
    if not tests:
        return None
    last = tests[-1]
    if "squared_error" in last:
        return last["step"], last["squared_error"]
    return last["step"], 2 * last["loss"]  # Euclidean loss: half the sum of squared errors


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--set", default="digits", choices=["digits", "mnist"], help="which chain (default digits)")
    parser.add_argument("-n", "--ranks", type=int, default=1, help="MPI ranks per job (default 1: serial)")
    parser.add_argument("--steps", type=int, help="train every job this many steps instead of its train_steps")
    parser.add_argument("--conf-dir", default=str(EXAMPLES), help="where the rbm_<set>_*.conf files are")
    args, extra = parser.parse_known_args(argv)  # the rest goes to every `singa-mpi train`
    rows = []
    for stage in STAGES:
        conf = os.path.join(args.conf_dir, f"rbm_{args.set}_{stage}.conf")
        workspace = resolve_workspace(load_job(conf), None)
        print(f"== {os.path.basename(conf)} -> {workspace}", flush=True)
        code = subprocess.call(command(conf, args.ranks, args.steps, extra),
                               env=find_launcher().environ() if args.ranks > 1 else None)
        if code != 0:
            print(f"rbm_chain: {os.path.basename(conf)} failed (exit {code})", file=sys.stderr)
            return code
        rows.append((os.path.basename(conf), final_test_error(workspace)))
    print("\nfinal test reconstruction error (sum of squared errors per held-out instance):")
    for name, result in rows:
        print(f"  {name:<32} " + (f"{result[1]:.4f}  (step {result[0]})" if result else "no test entry"))
    last = rows[-1][1]
    if last is not None:
        print(f"deep autoencoder reconstruction error: {last[1]:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
