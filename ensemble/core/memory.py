"""The memory a run may use: the cgroup's limit when one is set, else the machine's available memory.

Read from the kernel's files (no library reads a cgroup limit): cgroup v2 `memory.max`, cgroup
v1 `memory.limit_in_bytes` of this process's cgroup (`/proc/self/cgroup`), and `MemAvailable`
of `/proc/meminfo`. On a system without them (not Linux) nothing is known and nothing is
refused.
"""

from __future__ import annotations

import gc
from pathlib import Path

CGROUP = Path("/sys/fs/cgroup")


def _read_int(path: Path) -> int | None:
    try:
        text = path.read_text().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None  # "max": no limit


def cgroup_limit() -> int | None:
    """This process's cgroup memory limit in bytes, or None when none is set."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, controllers, rel = line.split(":", 2)
        rel = rel.lstrip("/")
        if controllers == "":  # v2
            limit = _read_int(CGROUP / rel / "memory.max")
        elif "memory" in controllers.split(","):  # v1
            limit = _read_int(CGROUP / "memory" / rel / "memory.limit_in_bytes")
        else:
            continue
        if limit is not None and limit < 1 << 60:  # v1 says "no limit" with ~2^63
            return limit
    return None


def available() -> tuple[int | None, str]:
    """`(bytes, what they are)`: the cgroup limit when one is set, else the machine's
    available memory (`MemAvailable`); `(None, "")` when neither can be read."""
    limit = cgroup_limit()
    if limit is not None:
        return limit, "the cgroup memory limit"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024, "the memory available on this machine"
    except (OSError, ValueError, IndexError):
        pass
    return None, ""


def release_arrow_pool() -> None:
    """Return the memory pyarrow's allocator keeps after reading (`MemoryPool.release_unused`).

    Its default pool (mimalloc or jemalloc) holds freed pages for reuse: after a pass over a
    large table that is a few hundred MiB the run never uses again (452 MiB after preparing a
    2M x 64 table), which would count against the memory the rest of the run may use.
    """
    import pyarrow

    pyarrow.default_memory_pool().release_unused()


def release_heap() -> bool:
    """Return the free pages of the C heap to the kernel (glibc's `malloc_trim(0)`); whether
    it ran (False: not glibc).

    glibc keeps what `free` gave back in its arenas, chiefly those of the threads that
    allocated it (a reading thread's chunks freed by the writing one): after preparing a
    1M x 64 table, 60 MiB of anonymous memory beyond the pyarrow pool's, which a memory
    cgroup counts for the rest of the run.
    """
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    trim(0)
    return True


def gib(n: float) -> str:
    """`n` bytes as GiB with two decimals (`1.50 GiB`)."""
    return f"{n / (1 << 30):.2f} GiB"


def skip_final_collection() -> None:
    """Spare the exiting process the interpreter's last garbage collections: `gc.freeze()`
    moves every live object to the permanent generation, which they never scan. After a
    training run they would walk every object TensorFlow and Keras made (2.2-2.6 s of an
    `ensemble train` of `wide` under load, 0.2-0.3 s frozen); the memory goes back to the
    system at exit either way. Exit functions (`atexit`) still run, and objects whose count
    of references drops to zero are still finalised."""
    gc.freeze()
