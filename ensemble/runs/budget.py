"""The memory a run will hold, estimated before work starts, and the refusal of a run that cannot fit.

The prepared splits live on disk (memory-mapped), and so do the validation and test predictions
of an in-graph run (`ensemble.tasks.eval_writer`: written as predicted, scored and written to
`predictions.parquet` a chunk of rows at a time); between-graph's aggregator reads the members'
prediction files by row groups into memory maps too (`ensemble.runs.posthoc.read_members`).
What grows with the data is then a few bytes per row: preparing's labels, their class codes
and each row's split (`ensemble.data.sources.assignment`), the members' batch order while
they train; the rank metrics' counts grow up to a bound
(`ensemble.tasks.classification.running.MAX_ENTRIES` distinct scores). Each TensorFlow
process adds its runtime (`TF_PROCESS`) and, while it trains, the batches of its traced calls
(`feed.CALL_BYTES`, `IN_FLIGHT` of them); a memory cgroup also charges the file pages a
TensorFlow process cannot run without (`FILE_SET`). The constants are measured
(`benchmarks/memory_flat.py`, docs/benchmarks.md "Data at scale"): a run refused here would
have been ended by the kernel's out-of-memory killer minutes later.
"""

from __future__ import annotations

from ensemble.core import memory
from ensemble.core.errors import UsageError
from ensemble.replication.feed import CALL_BYTES  # one traced call's batches
from ensemble.replication.modes import Mode
from ensemble.tasks.classification.running import MAX_ENTRIES  # rank counts held at most
from ensemble.tasks.eval_writer import CHUNK_ROWS  # rows of predictions built at a time

# anonymous bytes of a process (RssAnon) once its libraries are imported, measured: 277 MiB
# with TensorFlow imported (JAX hidden), 298 MiB with a Keras model fitted and called once;
# 107-112 MiB with NumPy, pyarrow, scikit-learn and this package
TF_PROCESS = 304 << 20
LEAN_PROCESS = 128 << 20
FILE_SET = 192 << 20  # per TensorFlow process: the library pages in use (a cgroup charges them)
# a preparing pass's Arrow pages (decoded row groups read ahead), chunks and the allocators'
# freed pages, `min(PREPARE_CHUNKS, PREPARE_BASE + PREPARE_ROW n)`: it grows with the chunks
# read until the allocators reuse their pages. Measured (a run's anonymous peak while
# preparing less its launcher's runtime; 64 float32 columns): 0.15 GiB at 250k rows, 0.30-0.39
# at 1M, 0.47-0.58 at 4M, 0.60-0.62 at 8M and 16M
PREPARE_CHUNKS = 576 << 20
PREPARE_BASE = 96 << 20
PREPARE_ROW = 256
# what preparing leaves in a process that trains next (in-graph): pyarrow's modules and the
# pools' pages kept; measured in-graph training peaks less the terms below: -0.03 to 0.07 GiB
# at 250k-16M rows (the epochs' validation outputs memory-mapped)
PREPARED = 64 << 20
# ... and what training leaves in it for evaluating (the members, their traced functions):
# measured in-graph evaluation peaks less the terms below: 0.11-0.21 GiB at 250k-16M rows
TRAINED = 160 << 20
SPLIT_ROW = 24  # bytes per source row while the split is drawn: the labels, a sorted copy
HELD_ROW = 3  # bytes per source row through the pass: class code, split code, training mask
IN_FLIGHT = 2  # call-sized buffers at once: the gather's two (`feed.Gather`)
BATCH_ROW = 16 << 10  # at most this many bytes per row in a call (a smaller split: smaller calls)
# evaluation's buffers (a chunk of every model's rows and its metrics), measured
# between-graph (its aggregator and launcher lean processes): 0.03-0.06 GiB at 250k-8M rows
EVAL_FIXED = 48 << 20
# a between-graph client's runtime besides its calls and rows, fitted on measured training
# peaks of 2 clients at once: 0.21-0.22 GiB per client at 1M-8M rows, 0.17 at 250k (below
# `TF_PROCESS`, the CLI's process with TensorFlow and pyarrow's dataset imported)
CLIENT_PROCESS = 232 << 20
# bytes per source row a client holds (its batch order; its splits' labels are memory-mapped):
# with `CLIENT_PROCESS`, measured between-graph training peaks of 2 clients (0.83, 0.85 and
# 0.92 GiB at 1M, 4M and 8M rows of 64 float32 columns) within 5% of the estimate
CLIENT_ROW = 8
LONG_ROW = 64  # bytes of one predictions.parquet row besides its outputs (columns, copies)
RANK_COUNT = 80  # bytes per distinct score of one class's rank-metric counts while they merge


def estimate(rows: dict[str, int], n_outputs: int, n_members: int, n_aggregators: int,
             clients: int, member_rows: bool = True) -> dict[str, int]:
    """Bytes a run holds at its largest (all its processes at once), by phase.

    With `n` source rows, `n_train` training rows, `n_split` rows of the larger of the
    validation and test splits, and `L` the launcher's runtime (`TF_PROCESS` in-graph,
    `LEAN_PROCESS` between-graph), the anonymous memory of each phase is:

    - prepare: `L + max(SPLIT_ROW n, min(PREPARE_CHUNKS, PREPARE_BASE + PREPARE_ROW n) +
      HELD_ROW n)`;
    - training, in-graph: `L + PREPARED + IN_FLIGHT calls + (4 n_members + 8) n_train`
      (each member's int32 batch order, an int64 permutation), `calls = min(CALL_BYTES,
      BATCH_ROW n_members n_train)`; between-graph: `L + clients (CLIENT_PROCESS +
      max(IN_FLIGHT calls, a chunk of prediction rows) + CLIENT_ROW n)`; the epochs'
      validation outputs go to a memory map in both modes (`MemberGroup.fit`'s
      `allocate`);
    - evaluation: `L + EVAL_FIXED + RANK_COUNT min(n_split, MAX_ENTRIES)`, in-graph `+
      TRAINED` (between-graph in an aggregator process of its own: `+ LEAN_PROCESS`).

    Each phase's figure adds `FILE_SET` per TensorFlow process (what a memory cgroup
    charges besides anonymous memory); `anonymous` is the largest phase without them, the
    figure `benchmarks/memory_flat.py` compares with a run's peak anonymous memory.

    Args:
        rows: `{split: rows}`; n_outputs: outputs per row (classes, or 2 for a Gaussian);
        n_members, n_aggregators: models whose predictions are kept;
        clients: TensorFlow processes at once (1 in-graph; between-graph clients).
        member_rows: between-graph: the launcher leaves TensorFlow to its clients (each
            writes its member's prediction rows), and an aggregator process evaluates; else
            the launcher trains and evaluates (in-graph).

    Returns:
        `{"prepare", "training", "predictions", "evaluation", "anonymous", "total"}` in
        bytes: each phase with its processes' file pages, `predictions` the rank counts,
        `total` the largest phase; and `<phase>_anonymous`, each phase without file pages.
    """
    launcher_tf = not member_rows
    n_eval = rows.get("validation", 0) + rows.get("test", 0)
    n_split = max(rows.get("validation", 0), rows.get("test", 0))
    n_rows = sum(rows.values())
    predictions = min(n_split, MAX_ENTRIES) * RANK_COUNT  # one class's counts at a time
    n_train = rows.get("train", n_rows)
    launcher = TF_PROCESS if launcher_tf else LEAN_PROCESS
    calls = IN_FLIGHT * min(CALL_BYTES, BATCH_ROW * n_members * n_train)
    orders = (4 * n_members + 8) * n_train
    client_rows = max(calls, min(n_eval, CHUNK_ROWS) * (LONG_ROW + 12 * n_outputs))
    anon = {
        "prepare": launcher + max(SPLIT_ROW * n_rows,
                                  min(PREPARE_CHUNKS, PREPARE_BASE + PREPARE_ROW * n_rows)
                                  + HELD_ROW * n_rows),
        "training": (launcher + PREPARED + calls + orders if launcher_tf
                     else launcher + clients * (CLIENT_PROCESS + client_rows
                                                + CLIENT_ROW * n_rows)),
        "evaluation": launcher + EVAL_FIXED + predictions
                      + (TRAINED if launcher_tf else LEAN_PROCESS),  # the aggregator's process
    }
    files = {"prepare": FILE_SET * launcher_tf, "evaluation": FILE_SET * launcher_tf,
             "training": FILE_SET * (1 if launcher_tf else clients)}
    parts = {phase: anon[phase] + files[phase] for phase in anon}
    parts["predictions"] = predictions
    parts.update({f"{phase}_anonymous": anon[phase] for phase in anon})
    parts["anonymous"] = max(anon.values())
    parts["total"] = max(parts["prepare"], parts["training"], parts["evaluation"])
    return parts


_DOING = {"prepare": "preparing", "training": "training", "evaluation": "evaluating"}
_LEVERS = {  # what lowers each phase
    "prepare": "train on fewer rows (a sample of the input)",
    "training": "train fewer --members",
    "evaluation": "lower data.test_size and data.validation_size (--set) or train fewer "
                  "--members"}


def check(rows: dict[str, int], n_outputs: int, n_members: int, n_aggregators: int,
          clients: int, member_rows: bool = True) -> None:
    """Refuse a run whose `estimate` exceeds the memory it may use (`core.memory.available`).

    Raises:
        UsageError: one line naming the estimate, the memory available and the levers.
    """
    have, what = memory.available()
    need = estimate(rows, n_outputs, n_members, n_aggregators, clients, member_rows)
    if have is None or need["total"] <= have:
        return
    n = sum(rows.values())
    process = (CLIENT_PROCESS if member_rows else TF_PROCESS) + FILE_SET
    phase = max(("prepare", "training", "evaluation"), key=need.__getitem__)
    jobs = " or fewer clients at once (--jobs)" if phase == "training" and member_rows else ""
    raise UsageError(
        f"This run would hold about {memory.gib(need['total'])} while {_DOING[phase]} "
        f"({n:,} rows; {memory.gib(need['predictions'])} of validation and test predictions; "
        f"{clients} TensorFlow process{'es' * (clients > 1)} at "
        f"{memory.gib(process)}), more than the "
        f"{memory.gib(have)} of {what}; {_LEVERS[phase]}{jobs}, or raise the limit.")


def check_run(cfg, mode: Mode, devices: list[str], rows: dict[str, int], n_outputs: int,
              jobs: int | None = None) -> None:
    """`check` for a run of config `cfg` in `mode` on `devices`, with `jobs` clients at once
    (between-graph; None: the launcher's default, `placement.default_jobs`).

    Raises:
        UsageError: the estimate exceeds the memory available (one line).
    """
    members = cfg.members.count
    check(rows, n_outputs, members, len(cfg.aggregation.aggregators),
          mode.processes(members, devices, jobs), member_rows=mode.member_files)
