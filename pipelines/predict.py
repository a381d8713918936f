"""`ensemble predict`: apply a trained run to a data set and write its predictions."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ensemble import artifacts, data, devices, run, tables
from ensemble.errors import UsageError
from ensemble.fitted import member_params
from ensemble.members import load_member
from ensemble.placement import place
from ensemble.posthoc import run_aggregators
from ensemble.preprocessing import Preprocessing


def load_input(run_dir: Path, source: str, target: str | None, strict: bool = False):
    """Read and scale the input of a prediction, matching its columns by name (extra columns
    ignored with a notice, or refused when `strict`; see `Preprocessing.read_input`).

    Returns:
        (manifest, preprocessing, scaled x `[n_rows, n_features]` float32,
        class indices `[n_rows]` or None when the input has no target column).
    """
    manifest = artifacts.read_manifest(run_dir)
    run.require_completed(run_dir, manifest)
    pre = Preprocessing.read(artifacts.verify(run_dir, manifest,
                                              Path(run_dir) / artifacts.PREPROCESSING))
    target = target or manifest["dataset"].get("target", "target")
    ds = pre.read_input(source, target, strict)
    x = pre.transform(ds)
    y = None if ds.y is None else data.encode(ds.y, pre.classes)
    return manifest, pre, x, y


def check_out(out: Path) -> Path:
    if out.suffix != ".parquet":
        raise UsageError(f"Expected --out to end in .parquet. Received: {out}")
    return out


def predict_in_graph(run_dir: Path, source: str, out: Path, target: str | None = None,
                     device_spec: str = "auto", batch_size: int = 16384,
                     cluster: dict | None = None, strict_columns: bool = False):
    """Rebuild the in-graph inference graph on this machine's (or `cluster`'s) devices and
    predict `source`.

    Returns:
        The predictions table (also written to `out`, split `predict`).
    """
    check_out(out)
    manifest, pre, x, y = load_input(run_dir, source, target, strict_columns)
    n = len(manifest["members"])
    devs = place(n, devices.resolve(device_spec, n, cluster))
    from ensemble.in_graph import InGraphEnsemble

    models = [load_member(artifacts.verify(run_dir, manifest,
                                           artifacts.member_model_path(run_dir, i)), d)
              for i, d in enumerate(devs)]
    aggs, fit = run_aggregators(run_dir, manifest)
    params = member_params(fit, list(range(n)))
    ens = InGraphEnsemble(models, devs, aggs, params=params)
    member_p, ens_p = ens.predict(x, batch_size)
    table = tables.predictions_table(dict(enumerate(member_p)), "predict",
                                     np.arange(len(x)), y, pre.classes, aggs, ens_p, params)
    artifacts.write_parquet(out, table)
    return table
