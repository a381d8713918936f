"""Test set-up: the CPU split into 4 logical devices before TensorFlow initialises, and tiny
configs so every training run takes seconds."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
# One OpenBLAS thread (NumPy, SciPy, scikit-learn), in this process and every process a test
# starts (they inherit it): two xdist workers and their TensorFlow processes already keep both
# cores busy, and OpenBLAS's pool of one spinning thread per core made the small problems of the
# suite (the stacking aggregator's logistic fits, cross-fitting) several times slower. Set
# before NumPy loads, as OpenBLAS sizes its pool then.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

N_LOGICAL_CPUS = 4


def pytest_configure(config):
    if config.pluginmanager.hasplugin("dsession"):  # the xdist controller runs no test
        return
    from ensemble.replication import devices

    devices.split_cpu(N_LOGICAL_CPUS)


TINY = """
[data]
source = "digits"
[members]
count = 4
hidden = [32]
dropout = 0.1
[training]
epochs = 2
batch_size = 64
seed = 3
[placement]
devices = "cpu:2"
"""


@pytest.fixture(scope="session")
def tiny_config(tmp_path_factory) -> Path:
    """A 4-member, 2-epoch digits config on 2 logical CPU devices."""
    path = tmp_path_factory.mktemp("configs") / "tiny.toml"
    path.write_text(TINY)
    return path


@pytest.fixture(scope="session")
def trained_once(tmp_path_factory, tiny_config) -> Path:
    """A completed 2-member, 1-epoch run of `tiny_config`, trained once per process; tests
    use `trained`'s copies."""
    run_dir = tmp_path_factory.mktemp("run") / "run"
    assert run_cli("train", "--config", tiny_config, "--run-dir", run_dir, "--members", "2",
                   "--epochs", "1", "--quiet") == 0
    return run_dir


@pytest.fixture(scope="module")
def trained(tmp_path_factory, trained_once) -> Path:
    """A copy of `trained_once`, one per test module (a module may change its files; a run
    holds no absolute path); modules that need another run define their own `trained`."""
    import shutil

    run_dir = tmp_path_factory.mktemp("run") / "run"
    shutil.copytree(trained_once, run_dir)
    return run_dir


def run_cli(*argv: str) -> int:
    from pipelines.cli import main

    return main([str(a) for a in argv])


def set_status(run_dir, status: str) -> None:
    """Rewrite a run's manifest status (to simulate a failed or interrupted run)."""
    from ensemble.core import artifacts

    manifest = artifacts.read_manifest(run_dir)
    manifest["status"] = status
    artifacts.write_manifest(run_dir, manifest)


def cli_env(**extra: str) -> dict[str, str]:
    """The environment of an `ensemble` subprocess: this checkout first on `PYTHONPATH` (an
    installed copy elsewhere must not shadow the code under test), plus `extra`."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, **extra)


def start_held(argv, tmp_path: Path, hold_at: str, member: int | None = None,
               stdout=subprocess.DEVNULL):
    """Start `ensemble ARGV` in its own process, to be held at `hold_at` ("EPOCH:STEP" or
    "EPOCH:end" or a write kind, see `tests/hold_site/sitecustomize.py`; only in member `member`'s process when given).
    The held process writes its pid to the returned marker file and waits while it exists.

    Returns:
        (the `subprocess.Popen`, stderr piped as text; the marker file).
    """
    marker = tmp_path / "hold.pid"
    env = cli_env(ENSEMBLE_TEST_HOLD_AT=hold_at, ENSEMBLE_TEST_HOLD_MARKER=str(marker))
    env["PYTHONPATH"] = os.pathsep.join((str(ROOT / "tests" / "hold_site"), env["PYTHONPATH"]))
    if member is not None:
        env["ENSEMBLE_TEST_HOLD_MEMBER"] = str(member)
    proc = subprocess.Popen([sys.executable, "-m", "pipelines.cli", *map(str, argv)], env=env,
                            stdout=stdout, stderr=subprocess.PIPE, text=True)
    return proc, marker


IRIS_RUN = """
[data]
source = "iris"
[members]
count = 2
hidden = [8]
[training]
epochs = 1
batch_size = 32
seed = 3
[placement]
devices = "cpu:1"
"""


@pytest.fixture(scope="session")
def iris_run(tmp_path_factory) -> tuple[Path, Path]:
    """A finished 2-member, 1-epoch iris run (in-graph) and the iris table as CSV: `(run
    directory, csv)`. Tests copy the run before changing it."""
    from sklearn.datasets import load_iris

    base = tmp_path_factory.mktemp("iris_run")
    (base / "iris.toml").write_text(IRIS_RUN)
    csv = base / "iris.csv"
    load_iris(as_frame=True).frame.to_csv(csv, index=False)
    assert run_cli("train", "--config", base / "iris.toml", "--run-dir", base / "run",
                   "--quiet") == 0
    return base / "run", csv


PLAIN_TF_SERVER = """
import json, os, sys, traceback
import tensorflow as tf  # noqa: F401 (loaded once, for every request)
replies = os.fdopen(int(sys.argv[1]), "w")
for line in sys.stdin:
    code, argv, cwd, out, err = json.loads(line)
    os.chdir(cwd)
    sys.argv, path = ["-c", *argv], list(sys.path)
    saved = os.dup(1), os.dup(2)
    with open(out, "w") as o, open(err, "w") as e:
        os.dup2(o.fileno(), 1)
        os.dup2(e.fileno(), 2)
        try:
            exec(compile(code, "<string>", "exec"), {"__name__": "__main__"})
            rc = 0
        except SystemExit as exc:
            rc = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
        except BaseException:
            traceback.print_exc()
            rc = 1
        imported = {"ensemble", "pipelines"} & set(sys.modules)
        if imported:
            print(f"{sorted(imported)} imported in the plain TensorFlow process",
                  file=sys.stderr)
            rc = 1
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
    for fd in saved:
        os.close(fd)
    sys.path[:] = path
    replies.write(json.dumps([rc, not imported]) + "\\n")
    replies.flush()
    if imported:  # not plain any more: the next script gets a fresh process
        break
"""


class PlainTensorFlow:
    """One plain TensorFlow process (this checkout not on `PYTHONPATH`, this package never
    imported: checked after every script) that runs scripts as `python -c CODE ARGV...` would,
    one at a time, each with its own globals, argv, working directory and output files:
    exports loaded where only TensorFlow is, without a TensorFlow start per script."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.count = 0
        self.proc = None

    def _start(self):
        read, write = os.pipe()
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["TF_CPP_MIN_LOG_LEVEL"] = "3"
        self.proc = subprocess.Popen([sys.executable, "-c", PLAIN_TF_SERVER, str(write)],
                                     stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, text=True, env=env,
                                     cwd=self.folder, pass_fds=(write,))
        os.close(write)
        self.replies = os.fdopen(read)

    def run(self, code: str, *argv, cwd: Path, timeout: float = 180
            ) -> subprocess.CompletedProcess:
        """Run `code` with `sys.argv[1:] == argv` in `cwd`; its exit status (1 for an
        exception, its traceback on stderr), stdout and stderr."""
        import select

        if self.proc is None or self.proc.poll() is not None:
            self._start()
        self.count += 1
        out, err = (self.folder / f"{self.count}.{k}" for k in ("out", "err"))
        self.proc.stdin.write(json.dumps([code, [str(a) for a in argv], str(cwd), str(out),
                                          str(err)]) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.replies], [], [], timeout)
        line = self.replies.readline() if ready else ""
        if not line:  # timed out or died: the next call starts another process
            self.close()
            raise AssertionError(f"the plain TensorFlow process gave no answer: "
                                 f"{err.read_text()[-2000:] if err.exists() else ''}")
        rc, alive = json.loads(line)
        if not alive:
            self.close()
        return subprocess.CompletedProcess(["-c", code, *argv], rc, out.read_text(),
                                           err.read_text())

    def close(self):
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.replies.close()
            self.proc = None


@pytest.fixture(scope="session")
def plain_tf(tmp_path_factory):
    """A `PlainTensorFlow` shared by the tests of this process, started at its first use."""
    server = PlainTensorFlow(tmp_path_factory.mktemp("plain_tf"))
    yield server
    server.close()
