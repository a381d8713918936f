"""The memory a run will hold, estimated before work starts, and the refusal of a run that cannot fit.

The prepared splits live on disk (memory-mapped), and so do the validation and test predictions
of an in-graph run (`ensemble.tasks.eval_writer`: written as predicted, scored and written to
`predictions.parquet` a chunk of rows at a time). What grows with the data is then the `[n_rows]`
label and index arrays of preparing, and the exact counts of the rank metrics (one class at
a time, the positive and negative rows of each distinct float32 score: at most one entry per
row of a split); between-graph's aggregator reads the members' prediction files by row groups into
memory maps too (`ensemble.runs.posthoc.read_members`). Each TensorFlow process adds its runtime (`TF_PROCESS`), the file pages it
cannot run without (`FILE_SET`) and, while it trains, the batches of its traced calls
(`feed.CALL_BYTES`, `IN_FLIGHT` of them). The figures are round upper estimates calibrated on
runs inside memory cgroups (`benchmarks/memory_flat.py`): a run refused here would have been
ended by the kernel's out-of-memory killer minutes later.
"""

from __future__ import annotations

from ensemble.core import memory
from ensemble.core.errors import UsageError
from ensemble.replication.feed import CALL_BYTES  # one traced call's batches
from ensemble.replication.modes import Mode
from ensemble.tasks.eval_writer import CHUNK_ROWS  # rows of predictions built at a time

TF_PROCESS = 400 << 20  # anonymous bytes of a process running TensorFlow and Keras (measured)
LEAN_PROCESS = 256 << 20  # a process without TensorFlow (NumPy, pyarrow, scikit-learn)
FILE_SET = 192 << 20  # per TensorFlow process: its libraries' code and the mapped rows it reads
PREPARE_CHUNKS = 320 << 20  # a preparing pass's chunks in flight (read, decoded, converted)
PREPARE_ROW = 8 << 10  # ... at most this many bytes per source row (small data, small chunks)
IN_FLIGHT = 4  # call-sized buffers at once: the gather's two (`feed.Gather`), temporaries
BATCH_ROW = 16 << 10  # at most this many bytes per row in a call (a smaller split: smaller calls)
EVAL_FIXED = 192 << 20  # evaluation's buffers besides its per-row arrays
LABEL_ROW = 32  # bytes per source row the launcher holds: labels, split indices, their copies
CLIENT_ROW = 16  # bytes per source row a client holds (its splits' labels and batch order)
LONG_ROW = 64  # bytes of one predictions.parquet row besides its outputs (columns, copies)
RANK_COUNT = 80  # bytes per row of a split: one class's rank-metric counts while they merge


def estimate(rows: dict[str, int], n_outputs: int, n_members: int, n_aggregators: int,
             clients: int, member_rows: bool = True) -> dict[str, int]:
    """Bytes a run holds at its largest (all its processes at once), by phase.

    The launcher (the process the user started) holds `LABEL_ROW` bytes per source row for
    the whole run. Its phases do not overlap, so the peak is the largest of: preparing (the
    launcher and the pass's chunks), training (each TensorFlow client's runtime and
    `IN_FLIGHT` traced calls' batches, `feed.CALL_BYTES` each, less for a small training split;
    the members' batch order; a between-graph client's chunk of its member's prediction rows,
    written as they are predicted once the member is trained) and evaluation (the validation
    and test predictions, in-graph in the launcher; between-graph in an aggregator process of
    its own, after the clients). Each TensorFlow process adds `FILE_SET` of file pages it
    cannot run without (a memory cgroup charges them too). The constants are round upper
    figures from whole-process peaks of 1M-8M-row runs, checked inside cgroup limits
    (docs/benchmarks.md, "Data at scale").

    Args:
        rows: `{split: rows}`; n_outputs: outputs per row (classes, or 2 for a Gaussian);
        n_members, n_aggregators: models whose predictions are kept;
        clients: TensorFlow processes at once (1 in-graph; between-graph clients).
        member_rows: between-graph: the launcher leaves TensorFlow to its clients (each
            writes its member's prediction rows), and an aggregator process evaluates; else
            the launcher trains and evaluates (in-graph). Either way the predictions are
            memory-mapped and what evaluation holds is the rank metrics' counts.

    Returns:
        `{"prepare", "training", "predictions", "evaluation", "total"}` in bytes: each
        phase with its processes' file pages, `total` the largest phase.
    """
    launcher_tf = not member_rows
    n_eval = rows.get("validation", 0) + rows.get("test", 0)
    n_split = max(rows.get("validation", 0), rows.get("test", 0))
    n_rows = sum(rows.values())
    # the rank metrics' counts (one model and class at a time); the members' rows are memory-mapped
    predictions = n_split * RANK_COUNT
    n_train = rows.get("train", n_rows)
    launcher = (TF_PROCESS if launcher_tf else LEAN_PROCESS) + LABEL_ROW * n_rows
    calls = IN_FLIGHT * min(CALL_BYTES, BATCH_ROW * n_members * n_train)
    # in-graph: every member's int32 batch order and its int64 permutation; a client (its
    # member's order within CLIENT_ROW): its calls, then a chunk of its member's prediction
    # rows (predicted and written `eval_writer.CHUNK_ROWS` rows at a time)
    orders = (4 * n_members + 8) * n_train
    client_rows = max(calls, min(n_eval, CHUNK_ROWS) * (LONG_ROW + 12 * n_outputs))
    files = FILE_SET if launcher_tf else 0  # the launcher's file pages, in every phase
    parts = {
        "prepare": launcher + min(PREPARE_CHUNKS, PREPARE_ROW * n_rows) + files,
        "training": (launcher + calls + orders + files if launcher_tf
                     else launcher + clients * (TF_PROCESS + client_rows + CLIENT_ROW * n_rows
                                                + FILE_SET)),
        "predictions": predictions,
        "evaluation": launcher + EVAL_FIXED + predictions
                      + (files if launcher_tf else LEAN_PROCESS),  # the aggregator's process
    }
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
    phase = max(("prepare", "training", "evaluation"), key=need.__getitem__)
    jobs = " or fewer clients at once (--jobs)" if phase == "training" and member_rows else ""
    raise UsageError(
        f"This run would hold about {memory.gib(need['total'])} while {_DOING[phase]} "
        f"({n:,} rows; {memory.gib(need['predictions'])} of validation and test predictions; "
        f"{clients} TensorFlow process{'es' * (clients > 1)} at "
        f"{memory.gib(TF_PROCESS + FILE_SET)}), more than the "
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
