"""Accuracy against confidence in `ensemble evaluate`: the block of the evaluation table (AURC and
accuracy with the share of rows kept at a few thresholds, per member and aggregator) and the
curves of `confidence.png` (`ensemble.tasks.risk_coverage`; regression: RMSE of the rows kept by
predictive std)."""

from __future__ import annotations

import numpy as np

from ensemble.tasks import model_arrays
from ensemble.tasks import risk_coverage as RC
from ensemble.tasks.model_arrays import PredictionArrays

NAME_WIDTH, COL = 35, 16
REGRESSION_SHARES = (0.5, 0.8, 0.9)
BY_STD = "predictive std"  # a `Task.confidence`: rows ranked by their predictive std


def _models(preds: PredictionArrays, split: str):
    """`(model, y, p)` per model of `split`, its labelled rows by `row` (regression: `p` =
    `[n_rows, 2]` mean and std), as the metrics table scores them (a row with an unknown
    `y_true`, a label the run never saw at predict, is left out, not its whole model); an
    aggregator whose rows are not probabilities (hard voting's vote shares) skipped: they are
    not confidences."""
    aggregators = preds.task.aggregators
    for (s, model), a in preds.models.items():
        if a.aggregator is not None and a.aggregator in aggregators \
                and not aggregators[a.aggregator].probabilities:
            continue
        if s == split and len(a.y):
            a = a.by_row()
            yield model, a.y, a.values


def curves(preds: PredictionArrays, split: str = "test") -> tuple[dict[str, tuple], bool]:
    """model -> (tau `[k]`, accuracy `[k]`, share kept `[k]`), or for a task whose
    `confidence` is its predictive std (share `[k]`, RMSE of the rows kept `[k]`, share
    `[k]`); and whether it is the latter. Empty for a task without a `confidence`.

    Args:
        preds: a predictions file's arrays (`model_arrays.read`).
    """
    out, by_std = {}, preds.task.confidence == BY_STD
    if preds.task.confidence is None:
        return out, by_std
    for model, y, p in _models(preds, split):
        if by_std:
            out[model] = (RC.SHARES, RC.rmse_vs_kept(y, p[:, 0], p[:, 1]), RC.SHARES)
        else:
            acc, kept = RC.accuracy_vs_confidence(y, p)
            out[model] = (RC.THRESHOLDS, acc, kept)
    return out, by_std


def shown_split(preds: PredictionArrays) -> str | None:
    """The split the block and `confidence.png` show: test, else validation, else the file's
    first (`predict` of `ensemble predict --layout long`); None for an empty file."""
    splits = preds.splits
    return next((s for s in ("test", "validation") if s in splits), splits[0] if splits else None)


def block(preds: PredictionArrays) -> list[str]:
    """The evaluation table's lines on accuracy against confidence, on `shown_split`; [] when
    it has no labelled model or the task no `confidence` (`preds`: a file's arrays,
    `model_arrays.read`)."""
    split = shown_split(preds)
    if split is None or preds.task.confidence is None:
        return []
    return _lines(split, preds.task.confidence == BY_STD, _models(preds, split))


def _lines(split: str, regression: bool, models) -> list[str]:
    """`block`'s lines from `(model, y, p)` of each model of `split` (`_models`)."""
    rows = list(models)
    if not rows:
        return []
    if regression:
        head = ["area rmse-cov"] + [f"rmse {int(100 * q)}% kept" for q in REGRESSION_SHARES]
        out = [f"RMSE of the rows kept by lowest predictive std on {split} (lower is better)",
               _line("model", head)]
        for model, y, p in rows:
            r = RC.rmse_vs_kept(y, p[:, 0], p[:, 1], REGRESSION_SHARES)
            out.append(_line("  " + model, [f"{RC.area_rmse_coverage(y, p[:, 0], p[:, 1]):.4g}"]
                             + [f"{v:.4g}" for v in r]))
        return out
    head = ["AURC"] + [f"acc@{t} (kept)" for t in RC.TABLE_THRESHOLDS]
    out = [f"accuracy against confidence on {split}: rows with top probability >= tau kept "
           "(AURC lower is better)", _line("model", head)]
    for model, y, p in rows:
        acc, kept = RC.accuracy_vs_confidence(y, p, RC.TABLE_THRESHOLDS)
        cells = [f"{RC.aurc(y, p):.4f}"] + [
            ("n/a" if np.isnan(a) else f"{a:.3f}") + f" ({k:.2f})" for a, k in zip(acc, kept)]
        out.append(_line("  " + model, cells))
    return out


def _line(name: str, cells) -> str:
    return f"{name:<{NAME_WIDTH}}" + "".join(f"{c:>{COL}}" for c in cells)


def block_of_file(path, task) -> list[str]:
    """`block` of a predictions file of a run of `task`, reading only the rows of the split it
    reports (test, else validation) and the columns it needs: a run's `predictions.parquet`
    holds every model's rows of both splits, several times what this needs.

    Raises:
        pyarrow.ArrowInvalid, OSError: a damaged file (callers verify its hash first).
    """
    import pyarrow.parquet as pq

    if task.confidence is None:
        return []
    schema = pq.read_schema(path)
    columns = model_arrays.columns(schema, task)

    def read(*filters):  # only these rows and columns
        return pq.read_table(path, columns=columns, filters=list(filters),
                             page_checksum_verification=True
                             ).replace_schema_metadata(schema.metadata)

    for split in ("test", "validation"):
        names = pq.read_table(path, columns=["model"], filters=[("split", "==", split)])
        if names.num_rows:  # one model's rows at a time
            models = dict.fromkeys(names.column("model").to_pylist())
            return _lines(split, task.confidence == BY_STD, (m for model in models for m in _models(
                model_arrays.of_table(read(("split", "==", split), ("model", "==", model)), task),
                split)))
    return []
