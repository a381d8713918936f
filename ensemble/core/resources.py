"""Resource limits read up front: the address-space limit (`ulimit -v`) and the cgroup's memory.

Under a small address-space limit (as HPC login nodes set) TensorFlow aborts while it starts
its threads (`pthread_create() failed`, pages of C++ log) and OpenBLAS spins for ever in its
thread start-up. So, before NumPy or TensorFlow load:

- `bound_threads` (the CLI's first act): when an address-space limit is set, BLAS and OpenMP
  pools get one thread (`OPENBLAS_NUM_THREADS`, `OMP_NUM_THREADS`, `MKL_NUM_THREADS`, unless
  the user set them) and glibc at most two malloc arenas (each arena reserves 64 MiB of address
  space per thread that allocates; `mallopt(M_ARENA_MAX)`).
- `check` (once the command is known): a limit below what the command needs to start is
  refused in one line naming the limit, its value and the need. The needs are floors measured
  on Linux x86-64 (TensorFlow 2.21: 2.8 GiB of address space to import and run a small
  graph, plus a stack per thread of its two pools; NumPy/pyarrow/scikit-learn commands 0.75
  GiB: `aggregate` cross-fitting with scikit-learn needed 0.65).

The cgroup's memory limit is `ensemble.core.memory.cgroup_limit`'s (this process's cgroup),
the figure a run's memory estimate is checked against too (`ensemble.runs.budget`).
"""

from __future__ import annotations

import os
import resource

from ensemble.core.errors import UsageError
from ensemble.core.memory import cgroup_limit, gib

GIB = 1 << 30
MIB = 1 << 20
TF_ADDRESS_SPACE = int(2.8 * GIB)  # import TensorFlow and run a small graph (measured)
LEAN_ADDRESS_SPACE = 768 * MIB  # NumPy, pyarrow, scikit-learn with one BLAS thread (0.65 measured)
TF_MEMORY = 768 * MIB  # resident memory TensorFlow needs to start and predict a little
LEAN_MEMORY = 256 * MIB
THREAD_VARS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def address_space_limit() -> int | None:
    """The soft `RLIMIT_AS` in bytes, or None when unlimited."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    return None if soft == resource.RLIM_INFINITY or soft < 0 else int(soft)


def bound_threads() -> None:
    """Under an address-space limit: one BLAS/OpenMP thread (unless set) and at most two
    malloc arenas. Call before NumPy loads (OpenBLAS starts its threads when it loads)."""
    if address_space_limit() is None:
        return
    for name in THREAD_VARS:
        os.environ.setdefault(name, "1")
    os.environ.setdefault("MALLOC_ARENA_MAX", "2")  # for child processes
    try:
        import ctypes

        ctypes.CDLL(None).mallopt(-8, 2)  # M_ARENA_MAX (glibc malloc.h) for this process
    except (OSError, AttributeError):  # not glibc
        pass


def _stack_bytes() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_STACK)
    return 8 * MIB if soft == resource.RLIM_INFINITY or soft <= 0 else min(soft, 64 * MIB)


def needs(tensorflow: bool) -> tuple[int, int]:
    """`(address space, memory)` in bytes a command needs to start: with TensorFlow, its base
    plus one stack per thread of its inter- and intra-op pools (one per core each)."""
    if not tensorflow:
        return LEAN_ADDRESS_SPACE, LEAN_MEMORY
    cores = os.cpu_count() or 1
    return TF_ADDRESS_SPACE + 2 * cores * _stack_bytes(), TF_MEMORY


def check(command: str, tensorflow: bool) -> None:
    """Refuse to start `command` under limits below its needs (`needs`).

    Raises:
        UsageError: names the limit (`ulimit -v` or the cgroup's memory), its value, what the
            command needs, and the lever.
    """
    space, memory = needs(tensorflow)
    what = "TensorFlow" if tensorflow else "NumPy"
    limit = address_space_limit()
    if limit is not None and limit < space:
        raise UsageError(f"ensemble {command}: the address-space limit (ulimit -v) is "
                         f"{gib(limit)}; {what} needs at least {gib(space)} to start here "
                         f"(raise it: ulimit -v {space // 1024 + 1} or unlimited)")
    cgroup = cgroup_limit()
    if cgroup is not None and cgroup < memory:
        raise UsageError(f"ensemble {command}: the cgroup memory limit is {gib(cgroup)}; "
                         f"{what} needs at least {gib(memory)} to start (raise the "
                         "container's or job's memory)")
