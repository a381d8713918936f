"""What a process of `ensemble` spends outside its work: importing TensorFlow leaves out the
libraries only Keras's and TensorFlow Lite's extras use, and the processes that load TensorFlow
(the CLI, a between-graph client) freeze their objects before exiting, so the interpreter's
last garbage collections skip what TensorFlow and Keras made."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# an exit function (run after `sys.exit`, before the interpreter's last collections) prints
# how many objects are frozen then
PROBE = "import atexit, gc, sys; atexit.register(lambda: print('frozen', gc.get_freeze_count()))"


def _frozen(code: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", f"{PROBE}; {code}"], cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    line = [x for x in out.stdout.splitlines() if x.startswith("frozen ")]
    assert line, out.stdout + out.stderr
    return out.returncode, int(line[-1].split()[1])


def test_the_cli_process_exits_with_its_objects_frozen():
    status, frozen = _frozen("from pipelines.process import run; run(lambda: lambda: 3)")
    assert status == 3 and frozen > 1000


def test_a_client_process_exits_with_its_objects_frozen():
    status, frozen = _frozen(
        "import runpy; sys.argv = ['client', '--request', 'not json']; "
        "runpy.run_module('ensemble.replication.client', run_name='__main__')")
    assert status == 2 and frozen > 1000


def test_tensorflow_loads_without_the_extras_which_stay_importable():
    pytest.importorskip("jax")
    code = ("import sys; from ensemble.core.tfimport import import_tensorflow_quietly; "
            "import_tensorflow_quietly(); import tensorflow; "
            "print(sorted(m for m in ('jax', 'matplotlib', 'pandas', 'sklearn') "
            "if m in sys.modules)); import jax, pandas; print('imported')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=300)
    assert out.stdout.splitlines() == ["[]", "imported"], out.stderr[-2000:]


def test_the_projects_own_process_imports_tensorflow_without_collecting_and_freezes_it():
    """`own_process()` (the CLI's and a client's process): no garbage collection runs while
    TensorFlow imports, every object alive after it is frozen and the collector is on again;
    a user's process (no `own_process`) collects as Python does and freezes nothing."""
    code = ("import gc, sys; from ensemble.core import tfimport; runs = []; "
            "gc.callbacks.append(lambda phase, info: runs.append(info['generation']) "
            "if phase == 'start' else None); "
            "sys.argv[1:] == ['own'] and tfimport.own_process(); "
            "tfimport.import_tensorflow_quietly(); "
            "print(len(runs), gc.get_freeze_count(), gc.isenabled())")
    seen = {}
    for argv in (["own"], []):
        out = subprocess.run([sys.executable, "-c", code, *argv], cwd=ROOT, check=False,
                             capture_output=True, text=True, timeout=300)
        collections, frozen, enabled = out.stdout.split()
        seen[bool(argv)] = int(collections), int(frozen), enabled
    assert seen[True][0] == 0 and seen[True][1] > 100_000 and seen[True][2] == "True", seen
    assert seen[False][0] > 0 and seen[False][1] == 0 and seen[False][2] == "True", seen
