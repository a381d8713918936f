"""The `examples/` scripts run as a user runs them (`bash`, or `runpy` as `python X.py` does: the
Python ones one after another in one fresh process, so TensorFlow loads once), at small sizes;
and the docs list what they promise: every public name of the API, every example, every CLI
command."""
from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
SMALL = {"members": "2", "epochs": "2"}


def _env(tmp_path: Path) -> dict:
    """This checkout first on the path, the venv's scripts (`ensemble`) on PATH, quiet TF."""
    path = os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PYTHONPATH": path, "TF_CPP_MIN_LOG_LEVEL": "2",
            "PATH": os.pathsep.join([bin_dir, os.environ.get("PATH", "")]),
            "MEMBERS": SMALL["members"], "EPOCHS": SMALL["epochs"], "WORKDIR": str(tmp_path)}


def _run(command: list[str], tmp_path: Path) -> str:
    done = subprocess.run(command, cwd=tmp_path, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=240)
    assert done.returncode == 0, f"{command} exited {done.returncode}:\n{done.stdout[-3000:]}\n" \
                                 f"{done.stderr[-3000:]}"
    return done.stdout


PYTHON_EXAMPLES = {  # script -> its extra arguments at smoke size
    "images_own_model.py": [], "regression_intervals.py": [], "ood_evaluation.py": [],
    "serve_rest.py": [], "sklearn_pipeline.py": ["--folds", "2", "--small"]}

RUNNER = """
import contextlib, json, runpy, sys, traceback
from pathlib import Path
jobs, status_file, status = json.loads(sys.argv[1]), Path(sys.argv[2]), {}
for name, argv, out in jobs:
    sys.argv = [name, *argv]
    with open(out, "w") as f, contextlib.redirect_stdout(f):
        try:
            runpy.run_path(name, run_name="__main__")
            status[Path(name).name] = "ok"
        except BaseException:
            status[Path(name).name] = traceback.format_exc()
status_file.write_text(json.dumps(status))
"""


@pytest.fixture(scope="module")
def python_examples(tmp_path_factory):
    """Run every Python example once, at smoke size, one after another in ONE fresh process
    (`runpy`, as `python examples/X.py` runs it, each with its own argv and folder), so
    TensorFlow loads once for all of them. Returns: name -> (status, stdout, workdir)."""
    base = tmp_path_factory.mktemp("examples")
    jobs = []
    for name, extra in PYTHON_EXAMPLES.items():
        work = base / name.removesuffix(".py")
        work.mkdir()
        argv = ["--members", SMALL["members"], "--epochs", SMALL["epochs"], *extra]
        if name != "sklearn_pipeline.py":
            argv += ["--workdir", str(work)]
        jobs.append([str(EXAMPLES / name), argv, str(work / "stdout.txt")])
    done = subprocess.run([sys.executable, "-c", RUNNER, json.dumps(jobs),
                           str(base / "status.json")], cwd=base, env=_env(base),
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    status = json.loads((base / "status.json").read_text())
    return {name: (status[name], (base / name.removesuffix(".py") / "stdout.txt").read_text(),
                   base / name.removesuffix(".py")) for name in PYTHON_EXAMPLES}


def _example(results, name: str) -> tuple[str, Path]:
    status, out, work = results[name]
    assert status == "ok", f"{name} failed:\n{status}\n{out[-2000:]}"
    return out, work


def test_own_csv(tmp_path):
    _run(["bash", str(EXAMPLES / "own_csv.sh")], tmp_path)
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 21  # header + the 20 held-back rows
    header = rows[0]
    assert header[0] == "bottle_id" and "y_pred" in header
    assert {"p_barbera", "p_barolo", "p_grignolino"} <= set(header)


def test_images_own_model(python_examples):
    out, work = _example(python_examples, "images_own_model.py")
    assert "ensemble-mean" in out
    manifest = (work / "runs" / "cnn" / "manifest.json").read_text()
    assert "small_cnn" in manifest


def test_regression_intervals(python_examples):
    out, _ = _example(python_examples, "regression_intervals.py")
    assert "coverage_90" in out and "low_90" in out and "epistemic_std" in out


def test_ood_evaluation(python_examples):
    out, work = _example(python_examples, "ood_evaluation.py")
    assert "mutual_information" in out and "gaussian_noise" in out
    assert (work / "runs" / "digits_0_4" / "ood_entropy.png").is_file()


def test_serve_rest(python_examples):
    pytest.importorskip("starlette")
    out, work = _example(python_examples, "serve_rest.py")
    rows = [line for line in out.splitlines() if "entropy" in line]
    assert len(rows) == 3  # one answer per row sent
    assert (work / "models" / "iris" / "1" / "saved_model.pb").is_file()


def test_serve_rest_leaves_no_temporary_folder_even_when_it_fails(tmp_path):
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    for workdir in ([], ["--workdir", str(tmp_path / "work")]):  # its own folder, or the user's
        done = subprocess.run([sys.executable, str(EXAMPLES / "serve_rest.py"), "--epochs", "0",
                               *workdir], cwd=tmp_path, env={**_env(tmp_path), "TMPDIR": str(tmp)},
                              capture_output=True, text=True, timeout=240)
        assert done.returncode == 1 and "training.epochs" in done.stderr  # the failing step
        assert list(tmp.iterdir()) == []


def test_sklearn_pipeline(python_examples):
    out, _ = _example(python_examples, "sklearn_pipeline.py")
    assert "best: {" in out and "test accuracy" in out
    assert "(2, " in out  # predict_members: [n_members, n_rows, n_classes]


def test_docs_cover_every_public_name_example_and_command():
    import ensemble
    import ensemble.sklearn
    from pipelines.cli import COMMANDS

    api = (ROOT / "docs" / "reference" / "api.md").read_text()
    for name in [n for n in ensemble.__all__ if n != "__version__"]:
        assert f"ensemble.{name}" in api or f"ensemble.sklearn.{name}" in api, name
    for name in ensemble.sklearn.__all__:
        assert f"::: ensemble.sklearn.{name}" in api, name
    examples = (ROOT / "docs" / "examples.md").read_text()
    for script in sorted(EXAMPLES.iterdir()):
        assert f'--8<-- "examples/{script.name}"' in examples, script.name
    guide = (ROOT / "docs" / "reference" / "cli-guide.md").read_text()
    for command in COMMANDS:
        assert f"ensemble {command}" in guide, command


def test_cli_guide_synopsis_names_only_options_that_exist():
    """Every `--option` of the CLI guide's synopsis is one its command takes (the generated
    CLI reference is the parser itself; the hand-written synopsis must not drift from it)."""
    import re

    from pipelines.cli import COMMANDS
    from pipelines.options import build_parser

    commands = build_parser(COMMANDS).commands
    guide = (ROOT / "docs" / "reference" / "cli-guide.md").read_text()
    synopsis = guide.split("```", 2)[1]
    command, seen = None, 0
    for line in synopsis.splitlines():
        start = re.match(r"ensemble (\w+)", line)
        if start:
            command = start.group(1)
        for flag in re.findall(r"--[a-z][a-z-]*", line.split("#")[0]):
            assert flag in commands[command]._option_string_actions, (command, flag)
            seen += 1
    assert seen > 80  # the whole synopsis was read
