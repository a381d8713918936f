"""One answer everywhere (issue #30, points 3-7): identifier columns, `--set` and the training
flags, closed pipes and hints that name the command's own options, image folders resized at
predict as Keras resizes, and the Python API and estimators giving what the CLI gives.

Real files and real (tiny) runs: a breast-cancer table with an id-like `name` column and a
`clinic` text column, 2 members, 2 epochs; shared per module.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import ROOT, run_cli

SMALL = ["--members", "2", "--epochs", "2", "--devices", "cpu:2", "--quiet"]


def _options(command: str) -> set[str]:
    from pipelines.cli import COMMANDS
    from pipelines.options import build_parser

    return set(build_parser(COMMANDS).commands[command]._option_string_actions)


def _hints_taken(text: str, command: str) -> None:
    """Every `--option` a message names is an option of `command`."""
    named = set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", text))
    assert named <= _options(command), (named - _options(command), text)


@pytest.fixture(scope="module")
def table(tmp_path_factory) -> Path:
    from sklearn.datasets import load_breast_cancer

    frame = load_breast_cancer(as_frame=True).frame.iloc[:, [0, 1, 2, 3, 20, 21, 30]]
    rng = np.random.default_rng(0)
    frame.insert(0, "name", [f"patient-{i}-{rng.integers(10**6)}" for i in range(len(frame))])
    frame.insert(1, "clinic", rng.choice(["north", "south", "east"], len(frame)))
    frame["target"] = np.where(frame["target"] == 1, "benign", "malignant")
    path = tmp_path_factory.mktemp("table") / "patients.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.fixture(scope="module")
def trained(table, tmp_path_factory):
    """A run trained with `--set` and the training flags; (run dir, its stderr)."""
    run_dir = tmp_path_factory.mktemp("runs") / "run"
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = run_cli("train", "--data", table, *SMALL, "--run-dir", run_dir,
                         "--set", "model.params.hidden=[8]", "--learning-rate", "0.01",
                         "--batch-size", "64", "--set", "aggregation.aggregators=['mean']")
    assert status == 0, err.getvalue()
    return run_dir, err.getvalue()


# -- 3. identifier-like text columns ------------------------------------------------------

def test_identifier_column_is_carried_not_a_feature(trained, table, tmp_path, capsys):
    run_dir, err = trained
    line = next(x for x in err.splitlines() if "'name'" in x)
    assert "identifier" in line and "--categorical clinic,name" in line
    _hints_taken(line, "train")
    pre = json.loads((run_dir / "preprocessing.json").read_text())
    assert pre["identifiers"] == ["name"]
    assert not any(n.startswith("name") for n in pre["output_names"])
    assert "clinic=east" in pre["output_names"]
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["dataset"]["identifiers"] == ["name"]
    out = tmp_path / "p.csv"
    capsys.readouterr()
    assert run_cli("predict", "--run", run_dir, "--data", table, "--out", out, "--quiet") == 0
    said = capsys.readouterr()
    assert "'name'" not in said.err  # no "ignoring column" notice for it
    assert said.out == ""  # --quiet: the file is the answer
    got = pd.read_csv(out)
    assert got.columns[0] == "name"
    assert list(got["name"]) == list(pd.read_csv(table)["name"])


def test_identifier_rule_and_explicit_categorical(table):
    import pyarrow as pa

    from ensemble.data import sources
    from ensemble.config.schema import DataConfig
    from ensemble.data.identifiers import is_identifier

    kept = sources.load(DataConfig(source=str(table), categorical=("clinic", "name")))
    assert "name" in kept.categorical and kept.identifiers == ()
    auto = sources.load(DataConfig(source=str(table)))
    assert "name" not in auto.categorical and auto.identifiers == ("name",)
    col = pa.chunked_array  # the rule: > 50 distinct values and >= 90% of the known rows
    assert is_identifier(col([[f"r{i}" for i in range(51)]]))[0]
    assert not is_identifier(col([[f"r{i}" for i in range(50)]]))[0]  # too few rows
    assert not is_identifier(col([[f"r{i % 80}" for i in range(100)]]))[0]  # 80%
    assert is_identifier(col([[f"r{i}" for i in range(90)] + [None] * 10]))[0]


# -- 4. any config key from the command line ------------------------------------------------

def test_set_and_training_flags_reach_the_run_config(trained):
    config = json.loads((trained[0] / "manifest.json").read_text())["config"]
    assert config["training"]["learning_rate"] == 0.01
    assert config["training"]["batch_size"] == 64
    assert config["model"]["params"] == {"hidden": [8]}
    assert config["aggregation"]["aggregators"] == ["mean"]


@pytest.mark.parametrize("argv, expected", [
    (["--set", "training.learnig_rate=0.1"], "did you mean `training.learning_rate`"),
    (["--set", "training.learning_rate=fast"], "Expected `training.learning_rate` to "
                                               "be a number"),
    (["--set", "epochs"], "Expected --set SECTION.KEY=VALUE"),
    (["--set", "training.epochs.x=1"], "training.epochs"),
    (["--set", "model.params.hiden=[3]"], "Unknown parameter `model.params.hiden`"),
    (["--learning-rate", "0"], "expected a positive number"),
    (["--batch-size", "-3"], "expected a positive integer"),
    (["--hidden", "64"], "unrecognized arguments: --hidden 64 (a config key: --set "
                         "members.hidden=VALUE)"),
    (["--early-stopping", "5"], "--set training.early_stopping=VALUE"),
])
def test_bad_set_exits_2_with_one_line(tmp_path, capsys, argv, expected):
    assert run_cli("train", *argv, "--run-dir", tmp_path / "run") == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], lines
    assert not (tmp_path / "run").exists()


def test_compare_and_search_take_the_training_options():
    from pipelines.cli import COMMANDS
    from pipelines.options import parse
    from pipelines.flags import overrides

    _, args = parse(["compare", "--learning-rate", "0.1", "--batch-size", "16", "--set",
                     "members.hidden=[4]"], COMMANDS)
    assert overrides(args) == {"training.learning_rate": 0.1, "training.batch_size": 16,
                               "members.hidden": [4]}
    _, args = parse(["search", "--config", "x.toml", "--candidates", "2", "--select", "1",
                     "--set", "data.source=my.csv", "--set", "training.optimizer_params="
                     "{momentum = 0.9}"], COMMANDS)
    assert overrides(args) == {"data.source": "my.csv",
                               "training.optimizer_params": {"momentum": 0.9}}
    _, args = parse(["predict", "--run", "r", "--data", "d", "--out", "o.csv",
                     "--batch-size", "8"], COMMANDS)  # predict's own --batch-size: rows
    assert overrides(args) == {}


def test_docs_show_the_options():
    text = (ROOT / "docs" / "reference" / "cli-guide.md").read_text()
    for flag in ("--set training.", "--learning-rate", "--batch-size", "data.image_size"):
        assert flag in text, flag


# -- 5. closed pipes, hints ---------------------------------------------------------------

def test_closed_stdout_pipe_completes_the_run(tmp_path):
    run_dir = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pipelines.cli", "train", "--data", "iris", "--members", "2",
         "--epochs", "4", "--devices", "cpu:2", "--verbose", "--run-dir", str(run_dir)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
    first = proc.stdout.readline()  # the reader goes away after one line (`| head -1`)
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=300) == 0, err
    assert first.startswith(b"training 2 members for up to 4 epochs") and "Traceback" not in err
    assert "BrokenPipe" not in err
    assert json.loads((run_dir / "manifest.json").read_text())["status"] == "completed"


def test_predict_missing_value_hint_names_no_train_option(trained, table, tmp_path, capsys):
    frame = pd.read_csv(table)
    frame.loc[2, "mean radius"] = np.nan
    frame["when"] = pd.Timestamp("2024-01-01")
    bad = tmp_path / "bad.parquet"
    frame.to_parquet(bad)
    capsys.readouterr()
    assert run_cli("predict", "--run", trained[0], "--data", bad, "--out",
                   tmp_path / "p.csv") == 2
    err = capsys.readouterr().err
    assert "'mean radius' (1 row)" in err and "fill them in the data" in err
    _hints_taken(err, "predict")


# -- 6. image folders ---------------------------------------------------------------------

def _digit_folder(root: Path, rows, scale: int = 1) -> Path:
    from PIL import Image
    from sklearn.datasets import load_digits

    digits = load_digits()
    for i in rows:
        label = int(digits.target[i]) % 2
        img = Image.fromarray((digits.images[i] * 255 / 16).astype(np.uint8), "L")
        if scale != 1:
            img = img.resize((8 * scale, 8 * scale + 2), Image.NEAREST)  # 18 x 16: not square
        (root / str(label)).mkdir(parents=True, exist_ok=True)
        img.save(root / str(label) / f"{i:04d}.png")
    return root


@pytest.fixture(scope="module")
def image_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("images")
    folder = _digit_folder(base / "train", range(120))
    assert run_cli("train", "--data", folder, *SMALL, "--run-dir", base / "run",
                   "--set", "model.params.hidden=[8]") == 0
    return base


def test_predict_resizes_images_as_keras_load_img(image_run, capsys):
    import keras

    big = _digit_folder(image_run / "big", range(200, 230), scale=2)
    same = image_run / "same"  # the same images, resized by Keras itself
    for f in sorted(big.rglob("*.png")):
        img = keras.utils.load_img(f, color_mode="grayscale", target_size=(8, 8),
                                   interpolation="bilinear")
        (same / f.parent.name).mkdir(parents=True, exist_ok=True)
        img.save(same / f.parent.name / f.name)
    capsys.readouterr()
    assert run_cli("predict", "--run", image_run / "run", "--data", big, "--out",
                   image_run / "big.csv", "--quiet") == 0
    err = capsys.readouterr().err
    assert err.count("resized") == 1 and "8x8" in err and "bilinear" in err  # said once
    assert run_cli("predict", "--run", image_run / "run", "--data", same, "--out",
                   image_run / "same.csv", "--quiet") == 0
    assert "resized" not in capsys.readouterr().err
    a, b = pd.read_csv(image_run / "big.csv"), pd.read_csv(image_run / "same.csv")
    cols = [c for c in a.columns if c.startswith("p_")]
    assert len(a) == 30 and cols
    np.testing.assert_allclose(a[cols].to_numpy(), b[cols].to_numpy(), atol=1e-6)


def test_a_once_notice_prints_once_per_command_and_again_in_the_next(capsys):
    from ensemble.core.notices import notice, said_once

    for _ in range(2):  # two commands (or two API calls) each say it
        with said_once():
            notice("images are resized", once=True)
            notice("images are resized", once=True)
    notice("images are resized", once=True)  # outside a command: every time
    notice("images are resized", once=True)
    assert capsys.readouterr().err.count("notice: images are resized") == 4


def test_mixed_sizes_at_training_name_the_setting(image_run, tmp_path, capsys):
    folder = _digit_folder(tmp_path / "mixed", range(20))
    _digit_folder(folder, range(20, 22), scale=2)
    assert run_cli("train", "--data", folder, *SMALL, "--run-dir", tmp_path / "run") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "[data] table" in err[0] and "image_size = [height, width]" in \
        err[0] and "--set data.image_size=[8,8]" in err[0], err
    _hints_taken(err[0], "train")


# -- 7. the Python API and the estimators ---------------------------------------------------

def test_run_predict_is_the_cli_wide_layout(trained, table, tmp_path, capsys):
    import ensemble

    run = ensemble.load_run(trained[0])
    frame = pd.read_csv(table).head(25)
    got = run.predict(frame)
    out = tmp_path / "cli.csv"
    frame.to_csv(tmp_path / "in.csv", index=False)
    assert run_cli("predict", "--run", trained[0], "--data", tmp_path / "in.csv", "--out",
                   out, "--quiet") == 0
    cli = pd.read_csv(out)
    assert list(got.columns) == list(cli.columns) and len(got) == 25
    assert list(got["name"]) == list(frame["name"])
    cols = [c for c in cli.columns if c.startswith("p_")]
    np.testing.assert_allclose(got[cols].to_numpy(np.float64), cli[cols].to_numpy(), atol=1e-6)
    metrics = run.metrics
    assert pd.api.types.is_integer_dtype(metrics["member"].dtype)
    assert pd.api.types.is_integer_dtype(metrics["n"].dtype)
    members = metrics.dropna(subset=["member"])
    assert sorted(set(members["member"].tolist())) == [0, 1]
    long = run.predict(frame, layout="long")
    assert pd.api.types.is_integer_dtype(long["member"].dtype)
    bad = frame.copy()
    bad.loc[1, "mean radius"] = np.nan
    capsys.readouterr()
    with pytest.raises(ValueError) as exc:
        run.predict(bad.assign(extra=1))
    err = capsys.readouterr().err + str(exc.value)
    assert "the DataFrame" in err and "ensemble-api-" not in err and "/tmp" not in err


def test_estimators_take_the_cli_table(trained, table):
    from ensemble.sklearn import DeepEnsembleClassifier, DeepEnsembleRegressor

    frame = pd.read_csv(table)
    y = frame.pop("target")
    small = dict(n_members=2, epochs=2, hidden=(8,), random_state=0, devices="cpu:2")
    clf = DeepEnsembleClassifier(**small).fit(frame, y)
    cli = json.loads((trained[0] / "preprocessing.json").read_text())
    assert clf.preprocessing_.output_names == cli["output_names"]
    assert clf.preprocessing_.identifiers == ("name",)
    assert clf.predict_proba(frame.head(5)).shape == (5, 2)
    holes = frame.copy()
    holes.loc[[3, 7], "mean texture"] = np.nan
    holes.loc[5, "clinic"] = None
    with pytest.raises(ValueError, match='impute="median"') as exc:
        DeepEnsembleClassifier(**small).fit(holes, y)
    assert "--" not in str(exc.value)
    filled = DeepEnsembleClassifier(**small, impute="median").fit(holes, y)
    proba = filled.predict_proba(holes)
    assert np.isfinite(proba).all() and np.allclose(proba.sum(axis=1), 1)
    reg = DeepEnsembleRegressor(**small, impute="median")
    target = holes.pop("mean area")
    mean, std = reg.fit(holes, target).predict(holes.head(4), return_std=True)
    assert np.isfinite(mean).all() and (std > 0).all()
    assert reg.preprocessing_.categories["clinic"] == ["east", "north", "south"]
