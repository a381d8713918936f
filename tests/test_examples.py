"""The `examples/` scripts run as a user runs them (a fresh process each, small sizes), and the
docs list what they promise: every public name of the API, every example, every CLI command."""
from __future__ import annotations

import csv
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


def _python_example(name: str, tmp_path: Path, *extra: str) -> str:
    return _run([sys.executable, str(EXAMPLES / name), "--members", SMALL["members"],
                 "--epochs", SMALL["epochs"], *(["--workdir", str(tmp_path)]
                                                if name != "sklearn_pipeline.py" else []),
                 *extra], tmp_path)


def test_own_csv(tmp_path):
    _run(["bash", str(EXAMPLES / "own_csv.sh")], tmp_path)
    with open(tmp_path / "predictions.csv", newline="") as f:
        rows = list(csv.reader(f))
    assert len(rows) == 21  # header + the 20 held-back rows
    header = rows[0]
    assert header[0] == "bottle_id" and "y_pred" in header
    assert {"p_barbera", "p_barolo", "p_grignolino"} <= set(header)


def test_images_own_model(tmp_path):
    out = _python_example("images_own_model.py", tmp_path)
    assert "ensemble-mean" in out
    manifest = (tmp_path / "runs" / "cnn" / "manifest.json").read_text()
    assert "small_cnn" in manifest


def test_regression_intervals(tmp_path):
    out = _python_example("regression_intervals.py", tmp_path)
    assert "coverage_90" in out and "low_90" in out and "epistemic_std" in out


def test_ood_evaluation(tmp_path):
    out = _python_example("ood_evaluation.py", tmp_path)
    assert "mutual_information" in out and "gaussian_noise" in out
    assert (tmp_path / "runs" / "digits_0_4" / "ood_entropy.png").is_file()


def test_serve_rest(tmp_path):
    pytest.importorskip("starlette")
    out = _python_example("serve_rest.py", tmp_path)
    rows = [line for line in out.splitlines() if "entropy" in line]
    assert len(rows) == 3  # one answer per row sent
    assert (tmp_path / "models" / "iris" / "1" / "saved_model.pb").is_file()


def test_sklearn_pipeline(tmp_path):
    out = _python_example("sklearn_pipeline.py", tmp_path, "--folds", "2", "--small")
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
