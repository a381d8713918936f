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
    return lines_of(split, regression, ((model, ranked(y, p, regression))
                                        for model, y, p in models))


def ranked(y: np.ndarray, p: np.ndarray, regression: bool) -> tuple[np.ndarray, np.ndarray]:
    """What the block ranks and scores of each row of one model, a few bytes per row:
    `(confidence [n_rows] (the top probability, p's type), correct [n_rows] bool)`, or for
    `regression` (`p` = `[n_rows, 2]` mean and std) `(std [n_rows], squared error [n_rows]
    float64)`. Rows of one model given in chunks may be ranked chunk by chunk and joined."""
    if regression:
        return p[:, 1], (np.asarray(y, np.float64) - np.asarray(p[:, 0], np.float64)) ** 2
    p = np.asarray(p)
    return p.max(axis=1), p.argmax(axis=1) == y


def cells(key: np.ndarray, value: np.ndarray, regression: bool) -> list[str]:
    """One model's cells of the block from its rows' `ranked` (all of them, in row order)."""
    if regression:
        r = RC.rmse_kept(value, key, REGRESSION_SHARES)
        return [f"{RC.area_rmse_kept(value, key):.4g}"] + [f"{v:.4g}" for v in r]
    acc, kept = RC.accuracy_kept(key, value, RC.TABLE_THRESHOLDS)
    return [f"{RC.aurc_of(key, value):.4f}"] + [
        ("n/a" if np.isnan(a) else f"{a:.3f}") + f" ({k:.2f})" for a, k in zip(acc, kept)]


def lines_of(split: str, regression: bool, models) -> list[str]:
    """`block`'s lines from `(model, (key, value))` of each model of `split` (`ranked`), or
    from `(model, cells)` already formatted (`cells`); [] when there is none."""
    rows = list(models)
    if not rows:
        return []
    if regression:
        head = ["area rmse-cov"] + [f"rmse {int(100 * q)}% kept" for q in REGRESSION_SHARES]
        out = [f"RMSE of the rows kept by lowest predictive std on {split} (lower is better)",
               _line("model", head)]
    else:
        head = ["AURC"] + [f"acc@{t} (kept)" for t in RC.TABLE_THRESHOLDS]
        out = [f"accuracy against confidence on {split}: rows with top probability >= tau "
               "kept (AURC lower is better)", _line("model", head)]
    for model, row in rows:
        out.append(_line("  " + model, row if isinstance(row, list) else
                         cells(*row, regression)))
    return out


class BlockBuilder:
    """The block of one split built from chunks of a predictions file's rows as they are
    written or read (each chunk's models in file order, one model's rows in row order),
    holding `ranked`'s few bytes per row of one model at a time: a model's cells are
    computed when the next model's rows start.

    Args:
        split: the split shown (`shown_split`); task: the run's task.
    """

    def __init__(self, split: str, task) -> None:
        self.split, self.task = split, task
        self.regression = task.confidence == BY_STD
        self.done: dict[str, list[str]] = {}
        self.model: str | None = None
        self.parts: list[tuple[np.ndarray, np.ndarray]] = []

    def add(self, preds: PredictionArrays) -> None:
        """Add one chunk's arrays (`model_arrays.of_batches` of a few record batches).

        Raises:
            ValueError: a model whose rows resume after another model's (the rows of a
                file not written model by model, `Task.prediction_chunks`' order).
        """
        if self.task.confidence is None:
            return
        for model, y, p in _models(preds, self.split):
            if model != self.model:
                self._finish()
                if model in self.done:
                    raise ValueError(f"Expected each model's rows together, model by model. "
                                     f"Received: rows of {model!r} after another model's")
                self.model = model
            self.parts.append(ranked(y, p, self.regression))

    def _finish(self) -> None:
        if self.model is not None and self.parts:
            key = np.concatenate([k for k, _ in self.parts])
            value = np.concatenate([v for _, v in self.parts])
            self.parts = []
            self.done[self.model] = cells(key, value, self.regression)
        self.model = None

    def lines(self) -> list[str]:
        """The block's lines ([] without a labelled model or a task `confidence`)."""
        self._finish()
        return lines_of(self.split, self.regression, self.done.items())


def _line(name: str, cells) -> str:
    return f"{name:<{NAME_WIDTH}}" + "".join(f"{c:>{COL}}" for c in cells)


def block_of_file(path, task) -> list[str]:
    """`block` of a predictions file of a run of `task`, read a record batch at a time (the
    columns it needs only) into `BlockBuilder` (test, else validation when the file has no test
    row): a few bytes per row of one model held.

    Raises:
        pyarrow.ArrowInvalid, OSError: a damaged file (callers verify its hash first).
    """
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if task.confidence is None:
        return []
    columns = model_arrays.columns(pq.read_schema(path), task)

    with pq.ParquetFile(path, page_checksum_verification=True, pre_buffer=False) as f:
        meta = f.schema_arrow.metadata or {}
        for split in ("test", "validation"):
            block, seen = BlockBuilder(split, task), False
            for batch in f.iter_batches(batch_size=model_arrays.BATCH_ROWS, columns=columns):
                rows = batch.filter(pc.equal(batch.column("split"), split))
                if rows.num_rows:
                    seen = True
                    block.add(model_arrays.of_batches(meta, task, [rows]))
            if seen:  # the split shown, even without a labelled row
                return block.lines()
    return []
