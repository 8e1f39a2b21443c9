"""How many threads numpy's BLAS (and the one scipy bundles, where separate) has right now, as
threadpoolctl sees them: the tests of the per-rank thread rule read it inside and outside runs."""
from __future__ import annotations

import pathlib

from threadpoolctl import threadpool_info


def blas_threads_now() -> dict[str, int]:
    """{'numpy': n, 'scipy': n}: the threads of numpy's BLAS and of the one scipy bundles, if separate."""
    import numpy
    import scipy
    import scipy.linalg.blas  # noqa: F401  (loaded, as in a run)

    scipy_folder = pathlib.Path(scipy.__file__).parent
    found = {}
    for info in threadpool_info():
        if info["user_api"] != "blas":
            continue
        owner = "scipy" if scipy_folder.name + ".libs" in info["filepath"] \
            or f"{scipy_folder}/" in info["filepath"] else "numpy"
        found.setdefault(owner, info["num_threads"])
    assert "numpy" in found, (numpy.__file__, threadpool_info())
    return found


def numpy_blas_threads() -> int:
    """The threads of numpy's BLAS now (in the calling thread's view: a limit set by another thread
    shows too, the library's count is per process)."""
    return blas_threads_now()["numpy"]
