"""`ensemble evaluate` reads its predictions file a record batch at a time
(`ensemble.tasks.model_arrays`): the metrics and the confidence block of a many-batch read
equal the whole table's, computed as evaluate did before it streamed, and the Arrow memory it
takes stays a fraction of the table's."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from ensemble import tasks
from ensemble.core.labels import encode
from ensemble.tasks import confidence, metrics_tables, model_arrays, tables
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.regression import tables as regression_tables

CLASSES = np.array(["cat", "dog", "eel"])
CLS, REG = tasks.get(), tasks.get("regression")


def _classification(n: int, seed: int = 0) -> pa.Table:
    """Validation and test rows of 3 members, mean and vote; some test labels unknown."""
    rng = np.random.default_rng(seed)
    parts = []
    for split in ("validation", "test"):
        members = {i: rng.dirichlet(np.ones(3) * 0.7, n).astype(np.float32) for i in range(3)}
        parts.append(tables.predictions_table(split, SplitPredictions(
            members, None, np.arange(n), rng.integers(0, 3, n)), CLASSES, ("mean", "vote"),
            task=CLS))
    parts.append(tables.predictions_table("predict", SplitPredictions(  # no labels at all
        members, None, np.arange(n), None), CLASSES, ("mean", "vote"), task=CLS))
    return pa.concat_tables(parts)


def _regression(n: int, seed: int = 1) -> pa.Table:
    rng = np.random.default_rng(seed)
    parts = []
    for split in ("validation", "test"):
        members = {i: np.column_stack([rng.normal(size=n), rng.uniform(0.2, 2, n)])
                   for i in range(3)}
        parts.append(regression_tables.predictions_table(split, SplitPredictions(
            members, None, np.arange(n), rng.normal(size=n)), ("mean", "std-scaling"),
            {"std-scaling": {"scale": 1.3}}))
    return pa.concat_tables(parts).replace_schema_metadata(parts[0].schema.metadata)


def _interleaved(table: pa.Table, rows: int) -> pa.Table:
    """The rows of `table` as `ensemble predict --layout long` writes them: every model's
    next `rows` rows in turn, rows of one model in their order, within each split."""
    order = []
    for split in dict.fromkeys(table.column("split").to_pylist()):
        models = [np.flatnonzero((table.column("split").to_numpy(zero_copy_only=False) == split)
                                 & (table.column("model").to_numpy(zero_copy_only=False) == m))
                  for m in dict.fromkeys(table.column("model").to_pylist())]
        for lo in range(0, max(len(m) for m in models), rows):
            order += [i for m in models for i in m[lo:lo + rows]]
    return table.take(pa.array(order))


def _old_groups(table: pa.Table):
    """`(split, model, its labelled rows)` as evaluate filtered the whole table before it
    streamed: splits sorted, models in the order of their first row."""
    labelled = table.filter(pc.is_valid(table.column("y_true")))
    for split in sorted(set(labelled.column("split").to_pylist())):
        part = labelled.filter(pc.equal(labelled.column("split"), split))
        for model in dict.fromkeys(part.column("model").to_pylist()):
            yield split, model, part.filter(pc.equal(part.column("model"), model))


def _old_classification(table: pa.Table) -> pa.Table:
    """`metrics_table` as evaluate computed it before it streamed: the whole table, filtered
    by split and model."""
    classes = tables.classes_from(table)
    outputs = {}
    for split, model, t in _old_groups(table):
        mi = t.column("mutual_information") if t.column("aggregator")[0].as_py() else None
        outputs.setdefault(split, []).append(metrics_tables.ModelOutput(
            model, t.column("member")[0].as_py(), t.column("aggregator")[0].as_py(),
            encode(t.column("y_true").to_numpy(zero_copy_only=False), classes),
            CLS.outputs_of(t, classes),
            None if mi is None or mi.null_count else float(np.mean(mi.to_numpy()))))
    return metrics_tables.metrics_of(outputs, classes=classes.tolist())


def _old_regression(table: pa.Table) -> pa.Table:
    outputs = {}
    for split, model, t in _old_groups(table):
        t = t.take(pc.sort_indices(t.column("row")))
        agg = t.column("aggregator")[0].as_py()
        outputs.setdefault(split, []).append(regression_tables.ModelOutput(
            model, t.column("member")[0].as_py(), agg,
            *(t.column(c).to_numpy() for c in ("y_true", "y_pred", "std")),
            None if agg is None else float(np.mean(t.column("epistemic_std").to_numpy()))))
    mix = json.loads(table.schema.metadata[b"mixture"])
    return regression_tables.metrics_of(outputs, mix)


def _old_block(table: pa.Table) -> list[str]:
    """The confidence block computed from the whole table's test rows."""
    classes = tables.classes_from(table)
    part = table.filter(pc.equal(table.column("split"), "test"))
    models = []
    for model in dict.fromkeys(part.column("model").to_pylist()):
        t = part.filter(pc.equal(part.column("model"), model))
        if t.column("y_true").null_count or model == "ensemble-vote":
            continue
        t = t.take(pc.sort_indices(t.column("row")))
        models.append((model, encode(t.column("y_true").to_numpy(zero_copy_only=False),
                                     classes), CLS.outputs_of(t, classes)))
    return confidence._lines("test", False, models)


@pytest.mark.parametrize("layout", ["model by model", "interleaved"])
def test_a_many_batch_read_scores_as_the_whole_table(tmp_path, layout):
    """Batches of 7 rows (a model's rows spread over many batches, a batch holding several
    models and splits) give the metrics and confidence block of the whole table, bit for
    bit; validation rows with an unknown label drop out of the metrics, as before."""
    table = _classification(101)
    unknown = pc.and_(pc.equal(table.column("split"), "validation"),
                      pc.less(table.column("row"), 5))
    table = table.set_column(table.schema.get_field_index("y_true"), "y_true", pc.if_else(
        unknown, pa.scalar(None, pa.string()), table.column("y_true")))
    if layout == "interleaved":
        table = _interleaved(table, 10)
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=50)

    arrays = model_arrays.read(tmp_path / "p.parquet", CLS, batch_rows=7)
    metrics = CLS.metrics_table(arrays)
    assert metrics.equals(_old_classification(table))
    assert set(metrics.column("n").to_pylist()) == {96, 101}  # validation, test
    assert confidence.block(arrays) == _old_block(table) and "on test" in _old_block(table)[0]
    assert arrays.splits == ["validation", "test", "predict"]
    assert arrays.get("validation", "member-1").unlabelled == 5
    assert arrays.get("predict", "member-1").unlabelled == 101


def test_a_many_batch_read_scores_a_regression_file_as_the_whole_table(tmp_path):
    table = _interleaved(_regression(83), 9)  # rows out of `row` order: regression sorts
    pq.write_table(table, tmp_path / "r.parquet", row_group_size=40)
    arrays = model_arrays.read(tmp_path / "r.parquet", REG, batch_rows=11)
    new, old = REG.metrics_table(arrays), _old_regression(table)
    assert new.equals(old)
    assert new.column("mixture_nll").null_count == 0 and new.num_rows == 10


MEMORY = """
import sys, pyarrow as pa
from pathlib import Path
from ensemble.runs.evaluate import evaluate
table, text = evaluate(None, Path(sys.argv[1]))
print(pa.default_memory_pool().max_memory())
"""


def _peak(tmp_path, n: int) -> tuple[int, int]:
    """(Arrow's peak allocation evaluating a file of `n` inputs per split, the whole
    table's size), in a fresh process."""
    table = _interleaved(_classification(n, seed=3), 32768)
    path = tmp_path / f"{n}.parquet"
    pq.write_table(table, path, row_group_size=32768)
    out = subprocess.run([sys.executable, "-c", MEMORY, str(path)], capture_output=True,
                         text=True, check=True)
    assert (tmp_path / f"{n}.metrics.parquet").is_file()
    return int(out.stdout.split()[-1]), table.nbytes


def test_evaluates_arrow_memory_does_not_grow_with_the_file(tmp_path):
    """From 300k to 900k rows (string labels), Arrow's peak allocation in evaluate grows by
    under a tenth of the table's growth (it held the table whole: by all of it)."""
    (small, small_bytes), (large, large_bytes) = _peak(tmp_path, 20000), _peak(tmp_path, 60000)
    assert large - small < (large_bytes - small_bytes) / 10, (small, large, large_bytes)


def test_a_search_runs_members_read_in_batches_are_by_splits(tmp_path, monkeypatch):
    """The members `evaluate` compares a search's selection with, read a few rows at a time,
    are `posthoc.by_split`'s of the whole table (order, probabilities, rows, labels)."""
    from functools import partial

    from ensemble.runs import posthoc, search_report

    table = _interleaved(_classification(101), 10)
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=50)
    monkeypatch.setattr(search_report.tasks, "for_run", lambda manifest: CLS)
    monkeypatch.setattr(search_report.artifacts, "verify", lambda d, m, p: tmp_path / "p.parquet")
    monkeypatch.setattr(model_arrays, "read", partial(model_arrays.read, batch_rows=7))
    new, old = (search_report._split_probs(tmp_path, None),
                posthoc.by_split(posthoc.member_rows(table), CLS))
    assert list(new) == ["validation", "test"]
    for split, s in new.items():
        assert s.members == old[split].members == [0, 1, 2]
        assert np.array_equal(s.probs, old[split].probs) and s.probs.dtype == np.float32
        assert np.array_equal(s.rows, old[split].rows) and np.array_equal(s.y, old[split].y)


def test_the_confidence_block_scores_the_labelled_rows_of_a_partly_labelled_split():
    """A few test rows with an unknown `y_true` (labels the run never saw, at predict) leave
    those rows out of the confidence block, as out of the metrics and of confidence.png; the
    block used to drop every model of the split, so it vanished."""
    table = _classification(60)
    unknown = pc.and_(pc.equal(table.column("split"), "test"), pc.less(table.column("row"), 4))
    partly = table.set_column(table.schema.get_field_index("y_true"), "y_true", pc.if_else(
        unknown, pa.scalar(None, pa.string()), table.column("y_true")))
    labelled = table.filter(pc.invert(unknown))
    block = confidence.block(model_arrays.of_table(partly, CLS))
    assert block and "on test" in block[0]
    assert block == confidence.block(model_arrays.of_table(labelled, CLS))
    assert [line.split()[0] for line in block[2:]] == [
        "member-0", "member-1", "member-2", "ensemble-mean"]
