"""Metrics over row chunks equal the whole-array ones (scikit-learn's, the tasks' numpy ones),
and the evaluation writer's tables from memory maps equal those read back from its file."""

import numpy as np
import pyarrow.parquet as pq
import pytest
from sklearn import metrics as S
from sklearn.preprocessing import label_binarize

from ensemble import tasks
from ensemble.tasks import eval_writer, metrics_tables, model_arrays
from ensemble.tasks.classification import metrics as M
from ensemble.tasks.classification import running
from ensemble.tasks.predicted import SplitPredictions
from ensemble.tasks.regression import metrics as RM
from ensemble.tasks.regression import running as regression_running
from ensemble.tasks.regression import tables as regression_tables


def _probs(rng, n, k, ties=0):
    y = rng.integers(0, k, n)
    logits = rng.normal(size=(n, k))
    logits[np.arange(n), y] += 1.0
    p = np.exp(logits)
    p = (p / p.sum(axis=1, keepdims=True)).astype(np.float32)
    if ties:  # repeated scores: the rank metrics' ties
        p[:ties] = p[0]
    return y, p


@pytest.mark.parametrize("k", [2, 3, 6])
@pytest.mark.parametrize("chunk", [1, 7, 10_000])
def test_chunked_classification_metrics_equal_scikit_learn(k, chunk):
    rng = np.random.default_rng(k)
    y, p = _probs(rng, 400, k, ties=40)
    got = running.metrics(y, p, chunk_rows=chunk)
    p64 = p.astype(np.float64)
    pred = p.argmax(axis=1)
    if k == 2:
        auc, ap = S.roc_auc_score(y, p64[:, 1]), S.average_precision_score(y, p64[:, 1])
    else:
        auc = S.roc_auc_score(y, p64, multi_class="ovr", average="macro")
        ap = S.average_precision_score(label_binarize(y, classes=range(k)), p64)
    want = {"roc_auc": auc, "average_precision": ap,
            "balanced_accuracy": S.balanced_accuracy_score(y, pred),
            "accuracy": S.accuracy_score(y, pred),
            "nll": S.log_loss(y, p64, labels=range(k)),  # no probability is below the clip
            "brier": M.brier(y, p), "ece": M.ece(y, p)}
    for name, value in want.items():
        assert got[name] == pytest.approx(value, rel=1e-9, abs=1e-12), name
    np.testing.assert_allclose(got["recall"], S.recall_score(y, pred, average=None),
                               rtol=1e-12)


def test_rank_metrics_skip_a_class_without_rows():
    """A class absent from the labels has no recall and no one-vs-rest AUC; the macro means
    run over the classes present (scikit-learn's on those columns)."""
    rng = np.random.default_rng(0)
    y, p = _probs(rng, 300, 4)
    y[y == 3] = 0
    got = running.metrics(y, p, chunk_rows=13)
    assert got["recall"][3] is None
    want = np.mean([S.roc_auc_score(y == c, p[:, c].astype(np.float64)) for c in range(3)])
    assert got["roc_auc"] == pytest.approx(want, rel=1e-12)
    assert got["balanced_accuracy"] == pytest.approx(
        S.balanced_accuracy_score(y, p.argmax(axis=1)), rel=1e-12)


@pytest.mark.parametrize("chunk", [1, 5, 64])
def test_chunked_regression_metrics_equal_the_whole_array(chunk):
    rng = np.random.default_rng(1)
    n, m = 200, 3
    mu_m = rng.normal(size=(m, n)) * 3 + 10
    var_m = rng.uniform(0.5, 2.0, size=(m, n))
    y = rng.normal(size=n) * 3 + 10
    w = np.array([0.5, 0.3, 0.2])
    mu = w @ mu_m
    sd = np.sqrt(w @ (var_m + mu_m ** 2) - mu ** 2)
    acc = regression_running.Running()
    for lo in range(0, n, chunk):
        s = slice(lo, lo + chunk)
        acc.update(y[s], mu[s], sd[s], mu_m[:, s], var_m[:, s], w)
    got, want = acc.result(), RM.all_metrics(y, mu, sd, mu_m, var_m, w)
    for name in RM.METRICS:
        assert got[name] == pytest.approx(want[name], rel=1e-9), name
    assert got["r2"] == pytest.approx(S.r2_score(y, mu), rel=1e-9)


def test_writer_tables_from_memory_maps_equal_the_file_read_back(tmp_path):
    """Members as memory maps, aggregators computed a chunk at a time, tiny chunks: the
    metrics table written equals the one `metrics_table` computes from the file (bit for bit
    on the shared columns), with a `prior` row scored on the training shares."""
    rng = np.random.default_rng(2)
    k, n = 3, 150
    splits, files_dir = {}, tmp_path / "maps"
    files_dir.mkdir()
    files = eval_writer.OutputFiles(files_dir)
    for split in ("validation", "test"):
        y, _ = _probs(rng, n, k)
        members = files.new((2, n, k))
        for i in range(2):
            members[i] = _probs(rng, n, k)[1]
        splits[split] = SplitPredictions({0: members[0], 1: members[1]}, None,
                                         np.arange(n), y)
    shares = [0.5, 0.3, 0.2]
    old = eval_writer.CHUNK_ROWS
    eval_writer.CHUNK_ROWS = 16
    try:
        written = eval_writer.write(tmp_path, splits, tasks.get(), np.array(["a", "b", "c"]),
                                    ["mean", "vote"], None, prior=shares)
    finally:
        eval_writer.CHUNK_ROWS = old
    back = metrics_tables.metrics_table(model_arrays.read(tmp_path / "predictions.parquet",
                                                          tasks.get()))
    assert written.column_names == back.column_names
    for name in written.column_names:
        for a, b in zip(written.column(name).to_pylist(), back.column(name).to_pylist()):
            assert (a == b if a is None or isinstance(a, str)
                    else a == pytest.approx(b, rel=1e-9, abs=1e-12)), name
    prior = [r for r in written.to_pylist() if r["model"] == "prior"]
    assert len(prior) == 2
    y = splits["test"].y
    test_prior = next(r for r in prior if r["split"] == "test")
    assert test_prior["nll"] == pytest.approx(-np.mean(np.log(np.array(shares)[y])), rel=1e-6)
    assert test_prior["roc_auc"] == pytest.approx(0.5)
    assert pq.read_schema(tmp_path / "predictions.parquet").metadata[b"prior"]
    assert not list(tmp_path.glob(".outputs*"))  # the scratch folder is gone


def test_regression_prior_row_is_the_training_gaussian(tmp_path):
    rng = np.random.default_rng(3)
    n = 80
    y = rng.normal(size=n) * 2 + 5
    member = np.column_stack([y + rng.normal(size=n) * 0.5, np.full(n, 0.25)])
    splits = {"test": SplitPredictions({0: member, 1: member + 0.1}, None, np.arange(n), y)}
    prior = {"mean": 4.0, "std": 3.0}
    table = eval_writer.write(tmp_path, splits, tasks.get("regression"), np.array([]), ["mean"],
                              None, prior=prior)
    row = next(r for r in table.to_pylist() if r["model"] == "prior")
    assert row["nll"] == pytest.approx(RM.nll(y, np.full(n, 4.0), np.full(n, 3.0)), rel=1e-9)
    assert row["rmse"] == pytest.approx(RM.rmse(y, np.full(n, 4.0)), rel=1e-9)
    back = regression_tables.metrics_table(model_arrays.read(tmp_path / "predictions.parquet",
                                                             tasks.get("regression")))
    assert back.column("nll").to_pylist() == pytest.approx(table.column("nll").to_pylist(),
                                                            rel=1e-9)


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_members_read_by_row_groups_equal_the_whole_tables(tmp_path, task):
    """`posthoc.read_members` (member files read 7 rows at a time into memory maps, rows in
    shuffled file order) gives `posthoc.by_split` of the concatenated tables."""
    import pyarrow as pa

    from ensemble.runs import posthoc
    from ensemble.tasks import tables

    rng = np.random.default_rng(4)
    n = 40
    classes = np.array(["a", "b", "c"]) if task == "classification" else np.array([])
    task = tasks.get(task)
    paths, parts = [], []
    for m in (1, 3):
        t = []
        for split in ("validation", "test"):
            if task.name == "classification":
                y, p = _probs(rng, n, 3)
            else:
                y = rng.normal(size=n)
                p = np.column_stack([y + rng.normal(size=n), rng.uniform(0.1, 1, n)])
            t.append(tables.predictions_table(split, SplitPredictions(
                {m: p}, {}, np.arange(100, 100 + n), y), classes, (), task=task))
        table = pa.concat_tables(t)
        table = table.take(rng.permutation(table.num_rows))  # any row order
        parts.append(table)
        paths.append(tmp_path / f"member-{m}.parquet")
        pq.write_table(table, paths[-1], row_group_size=11)
    whole = posthoc.by_split(pa.concat_tables(parts).replace_schema_metadata(
        tables.classes_metadata(classes)), task)
    files_dir = tmp_path / "maps"
    files_dir.mkdir()
    got = posthoc.read_members(paths, task, classes, eval_writer.OutputFiles(files_dir),
                               batch_rows=7)
    assert set(got) == set(whole)
    for split, s in whole.items():
        assert got[split].members == s.members == [1, 3]
        np.testing.assert_array_equal(got[split].probs, s.probs)
        np.testing.assert_array_equal(got[split].rows, s.rows)
        np.testing.assert_array_equal(got[split].y, s.y)


@pytest.mark.parametrize("k", [2, 4])
def test_rank_metrics_in_ranges_of_a_few_scores_equal_scikit_learn(k):
    """Rank counts bounded to a few distinct scores at a time (several passes over ranges of
    scores, from the highest down) give scikit-learn's ROC AUC and average precision, with
    ties, negative scores and -0.0 among the scores."""
    rng = np.random.default_rng(7 + k)
    y, p = _probs(rng, 300, k, ties=30)
    p[30:60] = -p[30:60]  # scores need not be probabilities: keys order negatives too
    p[60:70] = -0.0
    p64 = p.astype(np.float64)
    scored = [1] if k == 2 else range(k)  # one-vs-rest, macro (not probabilities any more)
    auc = np.mean([S.roc_auc_score(y == c, p64[:, c]) for c in scored])
    ap = np.mean([S.average_precision_score(y == c, p64[:, c]) for c in scored])
    for max_entries, chunk in ((1, 7), (5, 1), (40, 13)):
        got = running.rank_metrics(y, p, chunk_rows=chunk, max_entries=max_entries)
        assert got["roc_auc"] == pytest.approx(auc, rel=1e-9), max_entries
        assert got["average_precision"] == pytest.approx(ap, rel=1e-9), max_entries
    assert running._ranges(np.array([0, 2, 0, 3, 9]), 5) == [(4, 4), (1, 3)]


@pytest.mark.parametrize("limit", [1, 4, 1000])
def test_score_counts_merge_pending_chunks_exactly(limit):
    """Chunks kept pending and merged once they hold as many rows as the counts (at least
    `limit`) give np.unique's exact counts per distinct score, with ties across chunks, and
    never hold more pending rows than that bound and one chunk."""
    rng = np.random.default_rng(limit)
    scores = rng.integers(0, 9, 200).astype(np.float32) / 4
    positive = rng.random(200) < 0.3
    counts = running.ScoreCounts(limit)
    for lo, hi in zip([0, 1, 3, 10, 50, 120], [1, 3, 10, 50, 120, 200]):
        counts.update(scores[lo:hi], positive[lo:hi])
        assert counts._pending_rows < max(limit, len(counts._values)) + (hi - lo)
    values, inverse = np.unique(scores, return_inverse=True)
    np.testing.assert_array_equal(counts.values, values)
    np.testing.assert_array_equal(counts.pos, np.bincount(inverse[positive],
                                                          minlength=len(values)))
    np.testing.assert_array_equal(counts.neg, np.bincount(inverse[~positive],
                                                          minlength=len(values)))
    assert counts.pos.dtype == counts.neg.dtype == np.int64


def test_nll_and_accuracy_hold_no_float64_copy_of_the_probabilities():
    """NLL and accuracy of float32 probabilities pick or compare their values without a
    `[n_rows, n_classes]` float64 copy (8 bytes per row and class: an epoch's validation
    scores at 16M rows held 128 MiB of it per member), with the values of the copy's."""
    import tracemalloc

    rng = np.random.default_rng(4)
    y, p = _probs(rng, 50_000, 10)
    p[:5, 0] = 0.0  # clipped at NLL_CLIP where the true class has probability 0
    y[:5] = 0
    p64 = p.astype(np.float64)
    want_nll = float(-np.mean(np.log(np.clip(p64[np.arange(len(y)), y], M.NLL_CLIP, 1.0))))
    want_acc = float(np.mean(np.argmax(p64, axis=1) == y))
    tracemalloc.start()
    got = M.nll(y, p), M.accuracy(y, p)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert got == (want_nll, want_acc)  # bit for bit
    assert peak < p64.nbytes / 2
