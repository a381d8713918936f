"""`ensemble evaluate --ood SOURCE` and `ensemble evaluate --shift`: what the ensemble is for,
judged beyond test accuracy (Lakshminarayanan et al. 2017; Ovadia et al. 2019).

- `--ood`: the run's stored test predictions against the OOD inputs (a table, `.npz` or image
  folder the run takes, predicted here with the run's members; or a long-layout predictions
  Parquet of `ensemble predict` where they were already predicted): AUROC and AUPR per member,
  aggregator and score (`ensemble.tasks.ood`) -> `ood.parquet`.
- `--shift`: the stored test split under every corruption of `ensemble.data.corruptions` at
  severities 1-5, predicted with the run's members -> `shift.parquet` (accuracy, NLL, Brier,
  ECE; RMSE, NLL, 90% coverage for regression).

Prediction loads the members into one `MemberGroup` on this machine's devices, whichever mode
trained the run (a member is the same Keras file in both); the ensemble rows come from the
numpy aggregators with the run's fitted parameters, as `ensemble aggregate` computes them.
Files are written atomically under the run lock and their sha256 recorded in the manifest.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np
import pyarrow as pa

from ensemble.core import artifacts
from ensemble.data import corruptions
from ensemble.tasks import eval_writer, ood
from ensemble.runs import posthoc
from ensemble.core import runlock
from ensemble.core.manifest import Manifest
from ensemble.core.errors import UsageError
from ensemble.tasks.classification.fitted import member_params

OOD_FILE, SHIFT_FILE = "ood.parquet", "shift.parquet"
W = 12  # a cell of the printed OOD table: 22 + 6 * 12 = 94 columns
SHIFT_SCHEMA = pa.schema([
    ("model", pa.string()), ("member", pa.int32()), ("aggregator", pa.string()),
    ("corruption", pa.string()), ("severity", pa.int32()), ("n", pa.int64()),
    ("accuracy", pa.float64()), ("nll", pa.float64()), ("brier", pa.float64()),
    ("ece", pa.float64()), ("rmse", pa.float64()), ("coverage_90", pa.float64())])


class OodRun:
    """A completed run's manifest, stored test-split member outputs (memory maps of `files`,
    `eval_writer.OutputFiles`: its `predictions.parquet` read by row groups,
    `posthoc.read_members`), aggregators and fitted parameters; `predict(x)` gives the
    members' outputs on new scaled rows. `scores` names the task method the evaluation asks
    for (`"ood_scores"`, `"shift_scores"`): a task without it is refused before any row is
    read (`Task.require`)."""

    def __init__(self, run_dir: Path, files, scores: str):
        from ensemble.runs import run_status
        from ensemble import tasks

        self.run_dir = Path(run_dir)
        self.manifest = Manifest.load(self.run_dir)
        runlock.require_free(self.run_dir)
        run_status.require_completed(self.run_dir, self.manifest)
        self.task = tasks.for_run(self.manifest)
        self.task.require(scores)  # before the members' rows are read
        from ensemble.runs.evaluate import own_predictions

        self.files = files
        self.classes = np.asarray(self.manifest.dataset.classes)
        splits = posthoc.read_members([own_predictions(self.run_dir, self.manifest)],
                                      self.task, self.classes, files)
        self.split = "test" if "test" in splits else next(iter(splits))
        self.stored = splits[self.split]
        self.members = self.stored.members
        self.aggregators, self.fit = posthoc.run_aggregators(self.run_dir, self.manifest)
        self.params = member_params(self.fit, self.members)
        self._group = None

    def scores(self, outputs: np.ndarray) -> list[dict]:
        """`Task.ood_scores` of member `outputs` with the run's aggregators and parameters."""
        return self.task.ood_scores(outputs, self.aggregators, self.params, self.members)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Member outputs `[n_members, n_rows, n_classes | 2]` float64 of scaled rows `x`."""
        if self._group is None:
            from ensemble.replication import devices
            from ensemble.replication.group import MemberGroup
            from ensemble.models.members import load_run_member

            devs = devices.resolve("auto", len(self.members))
            placed = [devs[k % len(devs)] for k in range(len(self.members))]
            models = [load_run_member(self.run_dir, self.manifest, i, d)
                      for i, d in zip(self.members, placed)]
            self._group = MemberGroup(models, placed, self.members,
                                      task=self.task)
        return np.asarray(self._group.predict(np.asarray(x, np.float32))[0], np.float64)


def source_sha256(source: str) -> str | None:
    """sha256 of a file's bytes; of a folder, of its files' relative paths and sha256s in
    sorted order; None for a built-in data set name."""
    path = Path(source)
    if path.is_file():
        return artifacts.sha256_file(path)
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(path).as_posix()}\0{artifacts.sha256_file(p)}\n".encode())
        return h.hexdigest()
    return None


def _stored_ood(run: OodRun, source: Path) -> np.ndarray | None:
    """The member outputs of a long-layout predictions Parquet, or None when `source` is
    not one (then it is data to predict)."""
    if source.suffix != ".parquet" or not source.is_file():
        return None
    import pyarrow.parquet as pq

    try:
        names = pq.read_schema(source).names
    except (pa.ArrowInvalid, OSError) as exc:
        raise UsageError(f"Cannot read {source} as Parquet: {str(exc).splitlines()[0]}") \
            from None
    if not {"model", "member", "split"} <= set(names):
        return None
    splits = posthoc.read_members([source], run.task, run.classes, run.files)  # by row groups
    part = splits.get("predict") or next(iter(splits.values()))
    if part.members != run.members:
        raise UsageError(f"Expected --ood predictions of members {run.members}. Received "
                         f"members {part.members} in {source}")
    return part.probs


def _predict_source(run: OodRun, source: str) -> np.ndarray:
    from ensemble.data.kinds import input_stream
    from ensemble.runs.predict import open_run

    opened = open_run(run.run_dir)
    stream = input_stream(opened.preprocessing, source,
                          opened.manifest.dataset.target_or("target"),
                          quiet=True)
    stream.check()
    parts = [run.predict(b.x) for b in stream]
    if not parts or sum(p.shape[1] for p in parts) == 0:
        raise UsageError(f"Expected --ood {source} to hold rows. Received: none")
    return np.concatenate(parts, axis=1)


def evaluate_ood(run_dir: str | Path, source: str, plots: bool = False,
                 label: str | None = None) -> tuple[pa.Table, str]:
    """AUROC/AUPR of telling the run's test split from the OOD inputs `source`, for every
    member, aggregator and score; writes `ood.parquet` in the run (and with `plots`
    `ood_entropy.png`). `label` names the source in the table (default: `source`).

    Returns:
        (the `ood.parquet` table, the printed text).

    Raises:
        UsageError: the run is not completed or damaged, the source cannot be read or holds
            no row, or another process holds the run.
    """
    with eval_writer.output_files(Path(run_dir)) as files:  # member rows, memory-mapped
        run = OodRun(Path(run_dir), files, "ood_scores")
        outputs = _stored_ood(run, Path(source))
        if outputs is None:
            outputs = _predict_source(run, source)
        s_in, s_out = run.scores(run.stored.probs), run.scores(outputs)
    table = ood.ood_table(s_in, s_out, label or str(source), source_sha256(str(source)),
                          run.split)
    text = format_ood(table)
    plot = None
    if plots:
        from ensemble.tasks import plots_ood

        plots_ood._pyplot()  # refuse before writing anything when matplotlib is missing
        plot = lambda: plots_ood.entropy_histograms(  # noqa: E731
            run.run_dir, s_in, s_out, run.fit, run.task)
    written = _write(run.run_dir, run.run_dir / OOD_FILE, table, plot, "ensemble evaluate --ood")
    return table, text + "".join(f"\nplot: {p}" for p in written[1:])


def _write(run_dir: Path, path: Path, table: pa.Table, plot, command: str) -> list[Path]:
    """Write `table` to `path` and call `plot() -> Path` under the run lock, then record
    their sha256 in the manifest; returns the paths written."""
    with runlock.writing(run_dir, command):
        artifacts.write_parquet(path, table)
        written = [path] + ([plot()] if plot is not None else [])
        Manifest.update(run_dir, lambda m: m.record_hashes(run_dir, written))
    return written


def format_ood(table: pa.Table) -> str:
    """The printed OOD table: one line per model, AUROC and AUPR per score."""
    rows = table.to_pylist()
    scores = list(dict.fromkeys(r["score"] for r in rows))
    r0 = rows[0]
    head = (f"out-of-distribution detection: {r0['n_in']} {r0['in_split']} rows against "
            f"{r0['n_out']} rows of {r0['ood_source']}\n(OOD = positive; "
            + ("std = predictive std, epi = its epistemic part)" if "std" in scores else
               "maxp = 1 - max probability, ent = entropy, MI = mutual information)"))
    short = {"max_probability": "maxp", "entropy": "ent", "mutual_information": "MI",
             "std": "std", "epistemic_std": "epi"}
    cells = [f"{short.get(s, s[:7])} {k}" for s in scores for k in ("AUROC", "AUPR")]
    lines = [head, f"{'model':<22}" + "".join(f"{c:>{W}}" for c in cells)]
    by_model: dict[str, dict] = {}
    for r in rows:
        by_model.setdefault(r["model"], {})[r["score"]] = r

    def f(v):
        return "n/a" if v is None else f"{v:.4f}"

    members = [m for m, d in by_model.items() if next(iter(d.values()))["member"] is not None]
    for model, d in by_model.items():
        lines.append(f"{model:<22}" + "".join(f"{f(d[s][k]):>{W}}" for s in scores
                                              for k in ("auroc", "aupr")))
        if members and model == members[-1]:
            mean = [np.mean([by_model[m][s][k] for m in members])
                    if by_model[members[0]][s][k] is not None else None
                    for s in scores for k in ("auroc", "aupr")]
            lines.append(f"{'mean member':<22}" + "".join(f"{f(v):>{W}}" for v in mean))
    return "\n".join(lines)


def shift_table(run: OodRun, x: np.ndarray, y: np.ndarray, seed: int = 0) -> pa.Table:
    """The rows of `shift.parquet` for the split `(x, y)` (the model's inputs) of `run`."""
    image = x.ndim >= 3
    train_x = artifacts.read_split(run.run_dir, "train", run.manifest)[0].astype(np.float64)
    if image:
        pre_dtype = _array_dtype(run)
        lo, hi = (0.0, 255.0) if pre_dtype == "uint8" else (train_x.min(), train_x.max())
        span = max(hi - lo, 1e-12)
    else:
        flat = train_x.reshape(len(train_x), -1)
        std, median = flat.std(axis=0), np.median(flat, axis=0)
    recs = []
    for name in corruptions.names(image):
        for sev in corruptions.SEVERITIES:
            rng = corruptions.rng_for(seed, name, sev)
            if image:
                xc = corruptions.corrupt_images((x - lo) / span, name, sev, rng) * span + lo
            else:
                xc = corruptions.corrupt_table(x, name, sev, rng, std, median)
            out = run.predict(xc)
            models = [(f"member-{i}", i, None, o) for i, o in zip(run.members, out)]
            models += [(f"ensemble-{a}", None, a, run.task.aggregate(out, a, run.params.get(a)))
                       for a in run.aggregators]
            for model, member, agg, o in models:
                m = run.task.shift_scores(y, o, agg)
                recs.append({"model": model, "member": member, "aggregator": agg,
                             "corruption": name, "severity": sev, "n": len(y), **m})
    return pa.Table.from_pylist(recs, schema=SHIFT_SCHEMA)


def _array_dtype(run: OodRun) -> str | None:
    from ensemble.data import kinds

    pre = kinds.read_preprocessing(artifacts.verify(run.run_dir, run.manifest,
                                              run.run_dir / artifacts.PREPROCESSING))
    return getattr(pre, "dtype", None)


def evaluate_shift(run_dir: str | Path, plots: bool = False, seed: int = 0
                   ) -> tuple[pa.Table, str]:
    """The run's test split under every corruption at severities 1-5; writes `shift.parquet`
    in the run (and with `plots` `shift.png`).

    Returns:
        (the `shift.parquet` table, the printed text).

    Raises:
        UsageError: the run is not completed or damaged, or another process holds it.
    """
    with eval_writer.output_files(Path(run_dir)) as files:
        run = OodRun(Path(run_dir), files, "shift_scores")
        x, y, _ = artifacts.read_split(run.run_dir, run.split, run.manifest)
        table = shift_table(run, x, y, seed)
    text = format_shift(table, run.task, run.split)
    plot = None
    if plots:
        from ensemble.tasks import plots_ood

        plots_ood._pyplot()
        plot = lambda: plots_ood.shift_plot(run.run_dir, table, run.task)  # noqa: E731
    written = _write(run.run_dir, run.run_dir / SHIFT_FILE, table, plot,
                     "ensemble evaluate --shift")
    return table, text + "".join(f"\nplot: {p}" for p in written[1:])


def format_shift(table: pa.Table, task, split: str = "test") -> str:
    """The printed shift table: per corruption, the mean member and the first aggregator
    whose rows are probabilities (`Aggregator.probabilities`) per severity, in the run's
    `task`'s `shift_metrics` (accuracy, NLL and ECE; RMSE and NLL for regression)."""
    rows = table.to_pylist()
    keys = task.shift_metrics
    aggs = [r for r in rows if r["aggregator"] is not None]
    ens = next((r["model"] for r in aggs if r["aggregator"] in task.aggregators
                and task.aggregators[r["aggregator"]].probabilities),
               aggs[0]["model"] if aggs else rows[0]["model"])
    lines = [f"dataset shift on {split} ({rows[0]['n']} rows): mean member / {ens}, severity "
             "1-5"]
    table_rows = []
    for name in dict.fromkeys(r["corruption"] for r in rows):
        for k in keys:
            cells = []
            for sev in corruptions.SEVERITIES:
                part = [r for r in rows if r["corruption"] == name and r["severity"] == sev]
                mem = [r[k] for r in part if r["member"] is not None]
                mem = None if not mem or None in mem else float(np.mean(mem))
                e = next(r[k] for r in part if r["model"] == ens)
                cells.append("/".join("n/a" if v is None else f"{v:.3f}" for v in (mem, e)))
            table_rows.append((name, k, cells))
    # wide enough for every cell and a space: a regression's RMSE in target units is wide
    width = max([14, *(len(c) + 2 for _, _, cells in table_rows for c in cells)])
    lines += [f"  {name:<16}{k:<9}" + "".join(f"{c:>{width}}" for c in cells)
              for name, k, cells in table_rows]
    return "\n".join(lines)
