"""Data at scale: the streaming preprocessing equals scikit-learn's, a source read in chunks
gives the same prepared splits and members as one read whole, high-cardinality columns are
grouped, and a run that cannot fit in memory is refused before anything is written."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pytest

from conftest import run_cli
from ensemble import tasks
from ensemble.core.errors import UsageError


def _table(n=600, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(5, 3, (n, 3))
    x[rng.random((n, 3)) < 0.1] = np.nan
    cat = np.asarray([f"c{int(v) % 40}" for v in rng.zipf(1.5, n)], dtype=object)
    cat[rng.random(n) < 0.05] = None
    y = (np.nan_to_num(x[:, 0]) + rng.normal(size=n) > 5).astype(np.int64)
    return x, cat, y


@pytest.mark.parametrize("impute, max_categories", [("median", 0), ("most_frequent", 6),
                                                    ("median", 2)])
def test_streaming_fit_equals_scikit_learn(impute, max_categories):
    from sklearn.impute import SimpleImputer
    from sklearn.preprocessing import OneHotEncoder, StandardScaler

    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.sources import Dataset
    from ensemble.data.table_stats import TableStats

    x, cat, _ = _table()
    ds = Dataset("t", x.astype(np.float32), None, ("a", "b", "c"), {"k": cat})
    train = np.arange(0, len(x), 2)
    stats = TableStats(ds.feature_names, ("k",), impute, max_categories)
    for lo in range(0, len(train), 70):  # five uneven chunks
        stats.update(ds.rows(train[lo:lo + 70]))
    pre = Preprocessing(**stats.fitted(np.array([0, 1])))
    xt = ds.x.astype(np.float64)
    imp = SimpleImputer(strategy=impute).fit(xt[train])
    known = cat[train][cat[train] != None].astype(str).reshape(-1, 1).astype(object)  # noqa: E711
    fill = SimpleImputer(strategy="most_frequent").fit(known).statistics_[0]
    filled = np.where(cat == None, fill, cat).astype(str).reshape(-1, 1)  # noqa: E711
    enc = OneHotEncoder(max_categories=max_categories or None, sparse_output=False,
                        handle_unknown="infrequent_if_exist").fit(filled[train])
    raw = np.hstack([imp.transform(xt), enc.transform(filled)])
    expected = StandardScaler().fit(raw[train]).transform(raw)
    np.testing.assert_allclose(pre.transform(ds), expected, atol=2e-6)
    assert len(pre.output_names) == expected.shape[1]


@pytest.mark.parametrize("impute", ["error", "median"])
def test_a_chunk_s_rows_counted_in_place_give_the_same_bits(impute):
    """`TableStats.update(chunk, rows)` (the rows gathered into buffers kept between chunks,
    of uneven sizes: the buffers grow and are reused shorter) gives bit for bit the statistics
    of `update(chunk.rows(rows))`, numeric and categorical."""
    from ensemble.data.sources import Dataset
    from ensemble.data.table_stats import TableStats

    x, cat, _ = _table(900, seed=3)
    if impute == "error":
        x = np.nan_to_num(x, nan=1.5)
    ds = Dataset("t", x.astype(np.float32), None, ("a", "b", "c"), {"k": cat})
    rng = np.random.default_rng(1)
    gathered, copied = (TableStats(ds.feature_names, ("k",), impute, 6) for _ in range(2))
    for lo, hi in ((0, 200), (200, 260), (260, 700), (700, 900)):
        chunk = ds.rows(slice(lo, hi))
        rows = np.flatnonzero(rng.random(hi - lo) < 0.7)
        gathered.update(chunk, rows)
        copied.update(chunk.rows(rows))
    a, b = gathered.fitted(np.array([0, 1])), copied.fitted(np.array([0, 1]))
    for key in ("mean", "scale", "fill"):
        np.testing.assert_array_equal(a[key], b[key])
    assert a["categories"] == b["categories"] and gathered.counts == copied.counts
    assert gathered.n == copied.n > 0


def _write_csv(path, n=600):
    x, cat, y = _table(n)
    pcsv.write_csv(pa.table({"a": x[:, 0], "b": x[:, 1], "c": x[:, 2],
                             "k": pa.array(cat.tolist(), pa.string()), "label": y}), path)
    return path


def _prepare(tmp_path, name, source, chunk_rows, monkeypatch, **data):
    from ensemble.config import schema
    from ensemble.data import table_scan
    from ensemble.replication.modes import TrainRequest
    from ensemble.runs.builtin_modes import InGraph
    from ensemble.runs import prepare

    monkeypatch.setattr(table_scan, "CHUNK_ROWS", chunk_rows)
    cfg = schema.from_dict({"data": {"source": str(source), "target": "label",
                                     "impute": "median", **data},
                            "members": {"count": 2, "hidden": [8]}})
    prepare.prepare(TrainRequest(cfg, tmp_path / name), InGraph(), ["/device:CPU:0"])
    return tmp_path / name


def test_chunked_prepare_equals_one_chunk(tmp_path, monkeypatch):
    from ensemble.core import artifacts

    source = _write_csv(tmp_path / "t.csv")
    small = _prepare(tmp_path, "small", source, 64, monkeypatch, max_categories=8)
    whole = _prepare(tmp_path, "whole", source, 1 << 20, monkeypatch, max_categories=8)
    a, b = (json.loads((r / "preprocessing.json").read_text()) for r in (small, whole))
    for key in ("mean", "scale"):  # sums in another order: equal to float64 rounding
        np.testing.assert_allclose(a.pop(key), b.pop(key), rtol=1e-12)
    assert a == b
    for split in artifacts.SPLITS:
        (xa, ya, ra), (xb, yb, rb) = (artifacts.read_split(r, split) for r in (small, whole))
        assert isinstance(xa, np.memmap)
        np.testing.assert_allclose(xa, xb, atol=1e-6)
        np.testing.assert_array_equal(ya, yb)
        np.testing.assert_array_equal(ra, rb)


def test_one_pass_over_a_numeric_table_equals_fit_then_write(tmp_path, monkeypatch):
    """A table without categorical columns is read once (rows written as read, then scaled
    in place in the split files): the same preprocessing and the same bytes as fitting first
    and encoding in a second pass; rows without a label keep their file positions."""
    import pyarrow.parquet as pq

    from ensemble.config import schema
    from ensemble.core import artifacts
    from ensemble.data import kinds, prepared, sources, table_scan

    monkeypatch.setattr(table_scan, "CHUNK_ROWS", 64)
    x, _, y = _table()
    label = y.astype(np.float64)
    label[::50] = np.nan  # unlabelled rows: dropped
    pq.write_table(pa.table({"a": x[:, 0], "b": x[:, 1].astype(np.float32),
                             "c": np.arange(len(x)) % 7,
                             "label": pa.array(label, from_pandas=True)}), tmp_path / "n.parquet")
    cfg = schema.from_dict({"data": {"source": str(tmp_path / "n.parquet"), "target": "label",
                                     "impute": "median"}})
    fitted, hashes = {}, {}
    for name in ("one", "two"):
        scan = kinds.scan(cfg.data)
        assert scan.numeric_only
        which, classes, codes = sources.assignment(scan, cfg.data, 0, True)
        if name == "one":
            fitted[name], hashes[name] = prepared.prepare_splits(tmp_path / name, scan, which,
                                                                 codes, classes)
        else:
            fitted[name] = scan.fit(np.flatnonzero(which == 0), classes)
            hashes[name] = prepared.write_splits(tmp_path / name, scan, fitted[name], which,
                                                 codes)
        # hashed as written (the one-pass x as rewritten): the files' bytes on disk
        assert hashes[name] == {p: artifacts.sha256_file(p)
                                for p in sorted((tmp_path / name / "data").iterdir())}
    assert fitted["one"].to_json() == fitted["two"].to_json()
    for split in artifacts.SPLITS:
        one, two = (artifacts.read_split(tmp_path / n, split) for n in ("one", "two"))
        for a, b in zip(one, two):
            np.testing.assert_array_equal(a, b)
        assert not np.isin(one[2], np.arange(0, len(x), 50)).any()  # file rows, labelled
    assert sum(len(artifacts.read_split(tmp_path / "one", s)[2])
               for s in artifacts.SPLITS) == len(x) - 12


def test_high_cardinality_column_is_grouped_with_a_notice(tmp_path, monkeypatch, capsys):
    source = _write_csv(tmp_path / "t.csv")
    run = _prepare(tmp_path, "r", source, 1 << 20, monkeypatch, max_categories=5,
                  embed_above=0)
    pre = json.loads((run / "preprocessing.json").read_text())
    assert [n for n in pre["output_names"] if n.startswith("k=")][-1] == "k=infrequent"
    assert len([n for n in pre["output_names"] if n.startswith("k=")]) == 5
    err = capsys.readouterr().err
    assert "column 'k' has" in err and "data.max_categories" in err


def test_members_from_chunked_mapped_splits_equal_in_memory_members(tmp_path, monkeypatch):
    """A run prepared in chunks and trained from memory-mapped splits, in both modes, has
    the members of a group trained on the whole table held in memory."""
    import keras

    from ensemble import train
    from ensemble.config import schema
    from ensemble.core import artifacts
    from ensemble.data import sources, table_scan
    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.settings import DataConfig
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.replication.training import Schedule

    source = _write_csv(tmp_path / "t.csv")
    monkeypatch.setattr(table_scan, "CHUNK_ROWS", 100)
    config = {"data": {"source": str(source), "target": "label", "impute": "median"},
              "members": {"count": 2, "hidden": [8], "dropout": 0.0},
              "training": {"epochs": 2, "batch_size": 32, "seed": 5},
              "placement": {"devices": "cpu:2"}}
    runs = {m: train(config, mode=m, run_dir=tmp_path / m) for m in ("in-graph",
                                                                        "between-graph")}
    # the same rows prepared the old way: the whole table in memory, split, fitted, scaled
    cfg = schema.from_dict(config)
    ds = sources.load(DataConfig(source=str(source), target="label", impute="median"))
    rows, classes = sources.split(ds, cfg.data, cfg.data.split_seed)
    pre = Preprocessing.fit(ds, rows["train"], classes, "median", cfg.data)
    x = pre.transform(ds)
    y = np.searchsorted(classes, ds.y).astype(np.int32)
    mapped = artifacts.read_split(runs["in-graph"].path, "train")
    np.testing.assert_allclose(np.asarray(mapped[0]), x[rows["train"]], atol=1e-6)
    devs = ["/device:CPU:0", "/device:CPU:1"]
    ens = InGraphEnsemble.build(cfg, x.shape[1:], len(classes), devs, aggregators=(),
                                n_train=len(rows["train"]), pre=pre, task=tasks.get())
    ens.fit(x[rows["train"]], y[rows["train"]], (x[rows["validation"]],
            y[rows["validation"]]), Schedule.of(cfg.training))
    for mode, run in runs.items():
        for k, model in enumerate(ens.models):
            saved = keras.models.load_model(artifacts.member_model_path(run.path, k))
            for a, b in zip(saved.get_weights(), model.get_weights()):
                np.testing.assert_allclose(a, b, atol=1e-5, err_msg=f"{mode} member {k}")


def test_image_folder_decoded_in_chunks_gives_the_members_of_whole_decoding(tmp_path,
                                                                            monkeypatch):
    import keras
    from PIL import Image

    from ensemble import train
    from ensemble.config import schema
    from ensemble.core import artifacts
    from ensemble.data import array_scan, arrays, sources
    from ensemble.data.images import read_images
    from ensemble.replication.in_graph import InGraphEnsemble
    from ensemble.replication.training import Schedule

    rng = np.random.default_rng(0)
    folder = tmp_path / "images"
    files = []
    for i in range(48):
        (folder / "ab"[i % 2]).mkdir(parents=True, exist_ok=True)
        a = rng.integers(0, 200, (12, 12, 3), dtype=np.uint8)
        a[..., i % 2] += 55
        files.append(folder / "ab"[i % 2] / f"{i:03d}.png")
        Image.fromarray(a).save(files[-1])
    monkeypatch.setattr(array_scan.ArrayScan, "CHUNK_ROWS", 5)
    config = {"data": {"source": str(folder)}, "model": {"builder": "cnn",
                                                          "params": {"filters": [4],
                                                                     "dense": 8}},
              "members": {"count": 2}, "training": {"epochs": 1, "batch_size": 8},
              "placement": {"devices": "cpu:2"}}
    run = train(config, run_dir=tmp_path / "run")
    cfg = schema.from_dict(config)
    whole = arrays.load(cfg.data)
    x = read_images(whole.x.files, None, "rgb").x  # every image decoded at once, the old way
    rows, classes = sources.split(whole, cfg.data, cfg.data.split_seed)
    y = np.searchsorted(classes, whole.y).astype(np.int32)
    np.testing.assert_array_equal(np.asarray(artifacts.read_split(run.path, "train")[0]),
                                  x[rows["train"]])
    pre = arrays.ArrayPreprocessing.fit(whole, rows["train"], classes)
    ens = InGraphEnsemble.build(cfg, x.shape[1:], 2, ["/device:CPU:0", "/device:CPU:1"],
                                aggregators=(), pre=pre, task=tasks.get())
    ens.fit(x[rows["train"]], y[rows["train"]], (x[rows["validation"]], y[rows["validation"]]),
            Schedule.of(cfg.training))
    for k, model in enumerate(ens.models):
        saved = keras.models.load_model(artifacts.member_model_path(run.path, k))
        for a, b in zip(saved.get_weights(), model.get_weights()):
            np.testing.assert_allclose(a, b, atol=1e-5)


def test_run_that_cannot_fit_is_refused_before_anything_is_written(tmp_path, monkeypatch,
                                                                   capsys):
    from ensemble.core import memory

    monkeypatch.setattr(memory, "available",
                        lambda: (200 << 20, "the cgroup memory limit"))
    code = run_cli("train", "--data", "digits", "--run-dir", tmp_path / "run", "--epochs", "1")
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "0.20 GiB of the cgroup memory limit" in err
    assert "--members" in err and not (tmp_path / "run").exists()


def test_a_refused_overwrite_leaves_the_old_run_whole(tmp_path, monkeypatch, capsys):
    from ensemble.core import memory

    run = tmp_path / "run"
    assert run_cli("train", "--data", "iris", "--members", "2", "--epochs", "1",
                   "--run-dir", run, "--quiet") == 0
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    monkeypatch.setattr(memory, "available", lambda: (200 << 20, "the cgroup memory limit"))
    capsys.readouterr()
    assert run_cli("train", "--data", "iris", "--members", "2", "--epochs", "1",
                   "--run-dir", run, "--overwrite") == 2
    assert "0.20 GiB of the cgroup memory limit" in capsys.readouterr().err
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before


def test_fewer_clients_at_once_is_a_lever_that_works(tmp_path, monkeypatch, capsys):
    """The refusal's `--jobs` lever lowers the estimate: between-graph counts the clients the
    launcher starts (`--jobs`, one per member at most; by default one per core), not one per
    device."""
    from ensemble.core import memory
    from ensemble.replication import devices
    from ensemble.runs.builtin_modes import BetweenGraph

    between = BetweenGraph()
    two = ["/device:CPU:0", "/device:CPU:1"]
    monkeypatch.setattr(devices, "cpu_count", lambda: 2)
    assert [between.processes(4, two, jobs) for jobs in (None, 1, 2, 4, 8)] == [2, 1, 2, 4, 4]
    eight = [f"/device:CPU:{k}" for k in range(8)]
    assert between.processes(8, eight) == 2  # 8 logical devices on 2 cores: 2 clients
    monkeypatch.setattr(devices, "cpu_count", lambda: 8)
    assert between.processes(4, two) == 4  # 8 cores: 4 clients share the 2 devices
    monkeypatch.setattr(devices, "cpu_count", lambda: 2)
    assert between.processes(4, ["/job:worker/task:0/device:CPU:0",
                                 "/job:worker/task:1/device:CPU:0"], 1) == 2  # a client each
    monkeypatch.setattr(memory, "available", lambda: (1 << 30, "the limit"))
    argv = ["train", "--data", "digits", "--mode", "between-graph", "--devices", "cpu:2",
            "--prepare-only", "--quiet"]
    assert run_cli(*argv, "--run-dir", tmp_path / "a") == 2
    err = capsys.readouterr().err
    assert "2 TensorFlow processes" in err and "(--jobs)" in err
    assert run_cli(*argv, "--jobs", "1", "--run-dir", tmp_path / "b") == 0
    assert run_cli(*argv, "--jobs", "4", "--run-dir", tmp_path / "c") == 2
    assert "4 TensorFlow processes" in capsys.readouterr().err


def test_memory_estimate_is_the_largest_phase_with_its_processes_file_pages():
    from ensemble.replication.feed import CALL_BYTES
    from ensemble.runs import budget as b
    from ensemble.tasks.classification.running import MAX_ENTRIES

    rows = {"train": 7_000_000, "validation": 1_000_000, "test": 2_000_000}
    n = 10_000_000
    # one class's rank-metric counts: at most MAX_ENTRIES distinct scores, whatever the rows
    preds = MAX_ENTRIES * 80
    inside = b.estimate(rows, 2, 2, 3, clients=1, member_rows=False)
    assert inside["predictions"] == preds
    assert b.estimate({**rows, "test": 20_000_000}, 2, 2, 3, 1, False)["predictions"] == preds
    # preparing: the split's 24 bytes per row, or the pass's chunks and 3 bytes per row
    assert inside["prepare"] == b.TF_PROCESS + max(24 * n, b.PREPARE_CHUNKS + 3 * n) \
        + b.FILE_SET
    # ... the chunks below their bound: a fixed part and bytes per row
    small = b.estimate({"train": 700_000, "test": 300_000}, 2, 2, 3, 1, False)
    assert small["prepare"] == b.TF_PROCESS + b.PREPARE_BASE + b.PREPARE_ROW * 1_000_000 \
        + 3 * 1_000_000 + b.FILE_SET < inside["prepare"]
    # two calls' batches; each member's int32 batch order and the int64 permutation (the
    # epochs' validation outputs are memory-mapped, in both modes)
    assert inside["training"] == b.TF_PROCESS + b.PREPARED + 2 * CALL_BYTES \
        + (4 * 2 + 8) * 7_000_000 + b.FILE_SET
    # evaluating in the process that trained: what training left in it too
    assert inside["evaluation"] == b.TF_PROCESS + b.TRAINED + b.EVAL_FIXED + preds + b.FILE_SET
    assert inside["total"] == max(inside[p] for p in ("prepare", "training", "evaluation"))
    assert inside["anonymous"] == inside["total"] - b.FILE_SET  # one TensorFlow process
    # between-graph: a launcher without TensorFlow; 2 clients train at once, each with its
    # file pages; then an aggregator process (no TensorFlow) maps the members' rows
    between = b.estimate(rows, 2, 2, 3, clients=2, member_rows=True)
    assert between["training"] == b.LEAN_PROCESS + 2 * (b.CLIENT_PROCESS + 2 * CALL_BYTES
                                                        + b.CLIENT_ROW * n + b.FILE_SET)
    assert between["anonymous"] == between["training"] - 2 * b.FILE_SET
    # a client's chunk of its member's prediction rows (65,536 rows of 64 + 12 x 400 B)
    # outweighs its calls with many classes, and does not grow with the rows
    many = b.estimate(rows, 400, 2, 3, clients=2, member_rows=True)
    assert many["training"] == b.LEAN_PROCESS + 2 * (b.CLIENT_PROCESS + 65_536 * (64 + 4_800)
                                                     + b.CLIENT_ROW * n + b.FILE_SET)
    more = b.estimate({**rows, "test": 20_000_000}, 400, 2, 3, clients=2, member_rows=True)
    assert more["training"] - many["training"] == 2 * b.CLIENT_ROW * 18_000_000
    assert between["evaluation"] == 2 * b.LEAN_PROCESS + b.EVAL_FIXED + preds
    assert between["total"] == max(between["training"], between["evaluation"])
    # a training split smaller than a call: calls of its size, chunks of its size
    tiny = b.estimate({"train": 100, "test": 50}, 3, 2, 0, clients=1, member_rows=False)
    assert tiny["training"] == b.TF_PROCESS + b.PREPARED + 2 * (2 * 100 * (16 << 10)) \
        + 16 * 100 + b.FILE_SET
    assert tiny["prepare"] == b.TF_PROCESS + b.PREPARE_BASE + 150 * b.PREPARE_ROW + 3 * 150 \
        + b.FILE_SET


def test_refusal_names_the_phase_that_does_not_fit(monkeypatch):
    from ensemble.core import memory
    from ensemble.runs import budget as b

    monkeypatch.setattr(memory, "available", lambda: (1 << 30, "the cgroup memory limit"))
    b.check({"train": 1000, "test": 100}, 2, 2, 1, clients=1, member_rows=False)  # fits
    # preparing 60M rows: the split's 24 B per row (1.341 GiB) + TensorFlow's 0.297 GiB of
    # anonymous memory and its 0.1875 GiB of file pages (the rank counts stay bounded)
    with pytest.raises(UsageError, match=r"about 1\.83 GiB while preparing \(60,000,000 rows"):
        b.check({"train": 40_000_000, "test": 20_000_000}, 2, 2, 1, clients=1,
                member_rows=False)
    with pytest.raises(UsageError, match=r"while training .* 3 TensorFlow processes.* fewer "
                                         r"--members or fewer clients at once \(--jobs\)"):
        b.check({"train": 1000, "test": 100}, 2, 3, 1, clients=3, member_rows=True)


def test_cgroup_limit_is_read_from_the_process_cgroup(tmp_path, monkeypatch):
    from ensemble.core import memory

    cg = tmp_path / "cg"
    (cg / "memory" / "a" / "b").mkdir(parents=True)
    (cg / "memory" / "a" / "b" / "memory.limit_in_bytes").write_text("1610612736\n")
    (cg / "x").mkdir()
    (cg / "x" / "memory.max").write_text("max\n")
    monkeypatch.setattr(memory, "CGROUP", cg)
    real = memory.Path

    def fake(p):
        return tmp_path / "proc" if p == "/proc/self/cgroup" else real(p)

    (tmp_path / "proc").write_text("7:memory:/a/b\n0::/x\n")
    monkeypatch.setattr(memory, "Path", fake)
    assert memory.cgroup_limit() == 1610612736
    (tmp_path / "proc").write_text("0::/x\n")
    assert memory.cgroup_limit() is None


@pytest.mark.parametrize("task", ["classification", "regression"])
def test_streamed_evaluation_tables_equal_the_whole_table_ones(tmp_path, monkeypatch, task):
    """`eval_writer.write` (rows written a few at a time, metrics from the arrays) gives the
    predictions and metrics that building the whole long table gives (`predictions_table`,
    `metrics_table`)."""
    from ensemble.core import artifacts
    from ensemble import tasks
    from ensemble.tasks import eval_writer, model_arrays, tables

    the_task = tasks.get(task)
    rng = np.random.default_rng(3)
    n, k = 53, 3
    if task == "classification":
        classes = np.array(["ant", "bee", "cat"])
        members = {i: rng.dirichlet(np.ones(3), n).astype(np.float32) for i in (0, 2, 5)}
        aggs = ("mean", "vote", "geometric")
        y = {s: rng.integers(0, 3, n) for s in ("validation", "test")}
        ens = None
    else:
        classes = np.array([])
        members = {i: np.column_stack([rng.normal(size=n), rng.uniform(0.1, 2, n)])
                   .astype(np.float32) for i in range(k)}
        aggs = ("mean", "std-scaling")
        y = {s: rng.normal(size=n) for s in ("validation", "test")}
    params = {"std-scaling": {"scale": 1.3}} if task == "regression" else {}
    rows = np.arange(100, 100 + n, dtype=np.int64)
    whole, splits = [], {}
    for s in ("validation", "test"):
        t = tables.predictions_table(s, eval_writer.SplitPredictions(members, None, rows, y[s]),
                                     classes, aggs, params, task=the_task)
        whole.append(t)
        stacked = np.stack([members[i] for i in sorted(members)])
        if task == "classification":
            from ensemble.tasks.classification.aggregators import aggregate
        else:
            from ensemble.tasks.regression.aggregators import aggregate
        ens = {a: aggregate(stacked, a, params.get(a)) for a in aggs}
        splits[s] = eval_writer.SplitPredictions(members, ens, rows, y[s])
    whole = pa.concat_tables(whole)
    artifacts.write_parquet(tmp_path / "whole" / artifacts.PREDICTIONS, whole)
    artifacts.write_parquet(tmp_path / "whole" / artifacts.METRICS,
                            the_task.metrics_table(model_arrays.of_table(whole, the_task)))
    monkeypatch.setattr(eval_writer, "CHUNK_ROWS", 7)  # 8 chunks per model and split
    eval_writer.write(tmp_path / "streamed", splits, the_task, classes, aggs, params)
    for name in (artifacts.PREDICTIONS, artifacts.METRICS):
        a = artifacts.read_parquet(tmp_path / "whole" / name)
        b = artifacts.read_parquet(tmp_path / "streamed" / name)
        assert a.schema.equals(b.schema, check_metadata=True), name
        assert a.num_rows == b.num_rows and a.num_rows > 0
        for col in a.column_names:
            x, z = a.column(col).to_pylist(), b.column(col).to_pylist()
            if a.schema.field(col).type in (pa.float32(), pa.float64()):
                np.testing.assert_allclose(np.array(x, float), np.array(z, float),
                                           rtol=1e-12, atol=0, err_msg=f"{name} {col}")
            else:
                assert x == z, f"{name} {col}"


def test_confidence_block_read_from_the_file_equals_the_whole_table_one(tmp_path):
    """The train summary's accuracy-against-confidence block, read from the file's test rows
    and needed columns only, is the block of the whole predictions table."""
    from ensemble import tasks
    from ensemble.core import artifacts
    from ensemble.tasks import confidence, model_arrays, tables
    from ensemble.tasks.predicted import SplitPredictions

    task = tasks.get()
    rng = np.random.default_rng(5)
    n, classes = 40, np.array([0, 1, 2])
    members = {i: rng.dirichlet(np.ones(3), n).astype(np.float32) for i in range(3)}
    whole = pa.concat_tables([tables.predictions_table(s, SplitPredictions(
        members, None, np.arange(n), rng.integers(0, 3, n)), classes, ("mean", "vote"),
        task=task) for s in ("validation", "test")])
    artifacts.write_parquet(tmp_path / "p.parquet", whole)
    lines = confidence.block_of_file(tmp_path / "p.parquet", task)
    assert lines == confidence.block(model_arrays.of_table(whole, task)) and "on test" in lines[0]


def test_background_work_returns_its_result_or_raises_its_error():
    import threading

    from ensemble.core import background

    gate = threading.Event()
    result = background.start(lambda: (gate.wait(5), 42)[1])
    gate.set()  # the caller went on while the work waited
    assert result() == 42
    failing = background.start(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failing()


def test_prefetch_yields_every_item_in_order_and_raises_where_the_source_failed():
    import threading

    from ensemble.core import background

    produced = []

    def items(fail_at=None):
        for i in range(6):
            if i == fail_at:
                raise ValueError(f"item {i}")
            produced.append(threading.current_thread().name)
            yield i

    assert list(background.prefetch(items(), depth=2)) == list(range(6))
    assert set(produced) == {"ensemble-prefetch"}  # made in the background thread
    got = []
    with pytest.raises(ValueError, match="item 3"):
        for i in background.prefetch(items(fail_at=3)):
            got.append(i)
    assert got == [0, 1, 2]  # the items before the failure, then its error
    produced.clear()
    early = background.prefetch(items(), depth=1)
    assert next(early) == 0
    early.close()  # the consumer stops: the producer stops too, a bounded number ahead
    threading.Event().wait(0.3)
    assert len(produced) <= 3


def test_numeric_columns_become_the_float32_of_their_float64_values():
    """Columns are stacked in their own dtypes: the float32 features must still be each
    value rounded through float64 (64-bit integers beyond 2**53 round differently when cast
    to float32 directly), nulls NaN."""
    from ensemble.data import columns

    big = np.array([2**53 + 2**29 + 1, 2**62 + 2**37 + 1, 16777217, -2**61 - 2**36 - 3])
    table = pa.table({"i64": big, "u64": big.astype(np.uint64) // 2,
                      "i32": np.array([1, -7, 2**31 - 1, 5], np.int32),
                      "f16": np.array([0.5, 1e4, -3, 0], np.float16),
                      "f64": np.array([1 / 3, 1e30, -2.5, 7.1]),
                      "n": pa.array([1, None, 3, 4], pa.int64())})
    names, x, _, missing = columns.features(table, (), 0, None, [])
    expected = np.stack([np.asarray(table.column(n).to_numpy(zero_copy_only=False), np.float64)
                         for n in names], axis=1).astype(np.float32)
    assert names == tuple(table.column_names) and x.dtype == np.float32
    np.testing.assert_array_equal(x, expected)  # NaN where the null is, in both
    assert missing == [("n", 1)]
    assert not np.array_equal(big.astype(np.float32), expected[:, 0])  # the case is real
    problems = []
    columns.features(pa.table({"h": np.array([1, np.inf], np.float16)}), (), 0, None, problems)
    assert problems and "inf at row 1" in problems[0]


def test_columns_stacked_in_blocks_of_rows_are_their_float64_values_as_float32():
    """Blocks of 256 rows (a last partial block), columns of mixed dtypes: each value is its
    float64 value rounded to float32, as one `numpy.stack` in float64 gives."""
    from ensemble.data import columns

    rng = np.random.default_rng(3)
    n = 1000
    cols = [rng.integers(-2**31, 2**31 - 1, n).astype(np.int32), rng.normal(size=n) * 1e6,
            rng.normal(size=n).astype(np.float32), rng.integers(0, 2**32 - 1, n, np.uint32),
            rng.normal(size=n).astype(np.float16)]
    x = columns._stacked(cols, n, block_bytes=16)
    want = np.stack([c.astype(np.float64) for c in cols], axis=1).astype(np.float32)
    np.testing.assert_array_equal(x, want)
    assert x.flags.c_contiguous and columns._stacked([], 3).shape == (3, 0)


@pytest.mark.parametrize("shape", [(0, 4), (3, 0), (0, 6, 6, 1), (5, 3)])
def test_split_files_are_numpy_save_bytes_for_any_shape(tmp_path, shape):
    from ensemble.core import splitfiles

    x = np.arange(int(np.prod(shape)), dtype=np.float32).reshape(shape)
    splitfiles.write(tmp_path, "s", x, np.zeros(shape[0], np.int64), np.arange(shape[0]))
    np.save(tmp_path / "ref.npy", x)
    assert splitfiles.path(tmp_path, "s", "x").read_bytes() == (tmp_path / "ref.npy").read_bytes()
    got, y, row = splitfiles.read(tmp_path, "s")
    assert got.shape == shape and len(y) == len(row) == shape[0]


def test_a_split_written_so_far_reads_back_into_a_buffer(tmp_path):
    """`SplitWriter.read(..., out=)` fills the buffer's first rows with what `read` returns,
    a short last chunk included, and refuses a buffer of another dtype or row shape."""
    from ensemble.core import splitfiles

    x = np.random.default_rng(0).normal(size=(10, 3)).astype(np.float32)
    w = splitfiles.SplitWriter(tmp_path, "s", 10, (3,), (np.float32, np.int32))
    try:
        w.write(x, np.zeros(10, np.int32), np.arange(10) + 5)
        buf = np.full((4, 3), np.nan, np.float32)
        for lo in range(0, 10, 4):
            got = w.read(lo, lo + 4, out=buf)
            np.testing.assert_array_equal(got, x[lo:lo + 4])
            assert np.shares_memory(got, buf)
        np.testing.assert_array_equal(w.read(8, 12, "row", out=np.zeros(4, np.int64)), [13, 14])
        for bad in (np.zeros((4, 3)), np.zeros((4, 2), np.float32), np.zeros((1, 3), np.float32)):
            with pytest.raises(ValueError, match="rows into an array"):
                w.read(0, 4, out=bad)
    finally:
        w.abort()


def test_no_rows_still_need_every_training_column():
    from ensemble.core.errors import UsageError
    from ensemble.data.preprocessing import Preprocessing
    from ensemble.data.sources import Dataset

    pre = Preprocessing(("a", "b"), np.zeros(2), np.ones(2), np.array([0, 1]))
    with pytest.raises(UsageError, match="'b' missing"):
        pre.encode_scaled(Dataset("t", np.zeros((0, 1), np.float32), None, ("a",)))


@pytest.mark.parametrize("shape,dtype", [((5000, 64), np.float32), ((300, 64, 64, 3), np.uint8),
                                         ((10,), np.float64), ((0, 4), np.float32)])
def test_a_calls_batch_is_the_rows_at_the_members_indices(shape, dtype):
    from ensemble.replication.feed import Gather

    rng = np.random.default_rng(0)
    x = (rng.random(shape) * 255).astype(dtype)
    y = np.arange(len(x))
    idx = (rng.integers(0, len(x), (7, 2, 33)) if len(x)  # repeats, any order, blocks of 2 MiB
           else np.zeros((0, 2, 33), np.int64))
    xb, yb = Gather(x, y, np.int32)(idx)
    np.testing.assert_array_equal(xb, x[idx].astype(np.uint8 if dtype == np.uint8 else np.float32))
    np.testing.assert_array_equal(yb, y[idx])
    assert xb.dtype == (np.uint8 if dtype == np.uint8 else np.float32) and yb.dtype == np.int32


def test_the_infrequent_categories_notice_quotes_the_column_for_the_shell(capsys):
    """`--drop 'visit site'`, a command that works when pasted (it read `--drop visit site`)."""
    from ensemble.data.sources import Dataset
    from ensemble.data.table_stats import TableStats

    site = np.array([f"s{i % 5}" for i in range(40)], dtype=object)
    ds = Dataset("t", np.zeros((40, 1), np.float32), None, ("a",), {"visit site": site})
    stats = TableStats(ds.feature_names, ("visit site",), "error", 3)
    stats.update(ds.rows(np.arange(40)))
    stats.fitted(np.array([0, 1]))
    err = capsys.readouterr().err
    assert err.rstrip().endswith("leave the column out with --drop 'visit site'"), err


def test_default_prediction_batches_hold_at_most_64_mb_of_values(tmp_path):
    """Without --batch-size, a batch is 65,536 rows of a narrow table and fewer of wide rows:
    a 2,000-column table read 65,536 rows (1 GB of float64) a batch and peaked at 2.7 GB."""
    import pyarrow.parquet as pq

    from ensemble.data import kinds
    from ensemble.data.arrays import ArrayPreprocessing
    from ensemble.data.preprocessing import Preprocessing

    def table(n_cols):
        return Preprocessing(tuple(f"c{i}" for i in range(n_cols)), np.zeros(n_cols),
                             np.ones(n_cols), np.array([0, 1]))

    assert kinds.batch_rows_of(table(64)) == 65536
    assert kinds.batch_rows_of(table(2000)) == (64 << 20) // (8 * 2000) == 4194
    assert kinds.batch_rows_of(table(10 ** 6)) == 256  # never fewer rows than that
    image = ArrayPreprocessing((64, 64, 3), np.array([0, 1]), "uint8")
    assert kinds.batch_rows_of(image) == (64 << 20) // (8 * 64 * 64 * 3) == 682
    wide = pa.table({f"c{i}": np.arange(10.0) for i in range(2000)})
    pq.write_table(wide, tmp_path / "wide.parquet")
    stream = kinds.input_stream(table(2000), str(tmp_path / "wide.parquet"), "target")
    assert stream.batch_rows == 4194 and sum(len(b.rows) for b in stream) == 10
    assert kinds.input_stream(table(2000), str(tmp_path / "wide.parquet"), "target",
                              batch_rows=1000).batch_rows == 1000


@pytest.mark.parametrize("kind", ["classification", "regression"])
def test_confidence_block_built_chunk_by_chunk_holds_one_model(kind):
    """The train summary's confidence block built from 7-row chunks of the predictions as
    they are written (`ShownRows`) is the whole table's block, and it holds a few bytes per
    row of one model at a time: the rows of the models already seen are dropped."""
    from ensemble import tasks
    from ensemble.runs.evaluate import ShownRows
    from ensemble.tasks import confidence, model_arrays, tables
    from ensemble.tasks.predicted import SplitPredictions

    rng = np.random.default_rng(11)
    n = 45
    if kind == "classification":
        task, classes, aggs = tasks.get(), np.array([0, 1, 2]), ("mean", "vote")
        members = {i: rng.dirichlet(np.ones(3), n).astype(np.float32) for i in range(3)}
        members[0][:9] = members[0][0]  # tied confidences: the stable order counts
        y = rng.integers(0, 3, n)
    else:
        task, classes, aggs = tasks.get("regression"), np.array([]), ("mean",)
        members = {i: np.stack([rng.normal(size=n), rng.uniform(0.5, 2, n)], 1)
                   .astype(np.float32) for i in range(3)}
        y = rng.normal(size=n)
    whole = pa.concat_tables([tables.predictions_table(s, SplitPredictions(
        members, None, np.arange(n), y), classes, aggs, task=task)
        for s in ("validation", "test")])
    shown = ShownRows("test", task)
    held = []
    for batch in whole.to_batches(max_chunksize=7):
        shown(pa.Table.from_batches([batch]))
        held.append(sum(len(k) for k, _ in shown.block.parts))
    want = confidence.block(model_arrays.of_table(whole, task))
    assert shown.lines() == want and "on test" in want[0]
    assert len(want) == 2 + len(members) + len(aggs) - (kind == "classification")  # no vote
    assert 0 < max(held) <= n  # one model's test rows at most


def test_release_heap_returns_freed_arena_pages_to_the_kernel():
    """Arrays allocated by a thread and freed with a few kept between them stay in glibc's
    arena (the anonymous memory does not fall) until `release_heap` trims it."""
    import threading
    from pathlib import Path

    from ensemble.core import memory

    def anon() -> int:
        rollup = Path("/proc/self/smaps_rollup")
        if not rollup.is_file():
            pytest.skip("no /proc/self/smaps_rollup")
        return next(int(line.split()[1]) << 10 for line in rollup.read_text().splitlines()
                    if line.startswith("Anonymous:"))

    kept, freed = [], []

    def allocate():  # 100 KiB blocks: under glibc's mmap threshold, so in the thread's arena
        blocks = [np.ones(100 << 10, np.uint8) for _ in range(1500)]
        kept.extend(blocks[::10])
        freed.append(len(blocks))

    thread = threading.Thread(target=allocate)
    thread.start()
    thread.join()
    before = anon()
    if not memory.release_heap():
        pytest.skip("not glibc")
    assert before - anon() > 80 << 20  # of the ~130 MiB freed between the blocks kept
    assert freed == [1500] and len(kept) == 150


def test_member_group_predict_fills_its_outputs_batch_by_batch():
    """The members' outputs of many batches are those of each batch alone, in one array
    filled as predicted (no list of batches joined: twice the outputs at once); no row gives
    empty outputs of the members' shape."""
    import keras

    from ensemble.replication.group import MemberGroup

    keras.utils.set_random_seed(0)
    models = [keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)]) for _ in range(2)]
    group = MemberGroup(models, ["/cpu:0"] * 2, task=tasks.get())
    x = np.random.default_rng(0).normal(size=(2500, 4)).astype(np.float32)
    got, ens = group.predict(x, batch_size=1000)
    want = np.concatenate([group.predict(x[lo:lo + 1000])[0] for lo in (0, 1000, 2000)], 1)
    assert got.shape == (2, 2500, 3) and ens == {}
    np.testing.assert_array_equal(got, want)
    empty, _ = group.predict(x[:0])
    assert empty.shape == (2, 0, 3) and empty.dtype == got.dtype
