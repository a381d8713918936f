"""The memory a run will hold, estimated before work starts, and the refusal of a run that cannot fit.

The prepared splits live on disk (memory-mapped), so what grows with the data is what a run
keeps in memory besides them: the `[n_rows]` label and index arrays of preparing, and the
validation and test predictions: the members' and aggregators' `[n_rows, n_outputs]` outputs,
from which `predictions.parquet` is written a chunk of rows at a time
(`ensemble.tasks.eval_writer`), and for between-graph's aggregator the members' own prediction
rows, which it reads from their files. Each TensorFlow process adds
its runtime (`TF_PROCESS`) and, while it trains, the batches of its traced calls
(`feed.CALL_BYTES`, three in flight), which are gone before the predictions are made. The
figures are deliberately round upper estimates: a run refused here would have
been ended by the kernel's out-of-memory killer minutes later.
"""

from __future__ import annotations

from ensemble.core import memory
from ensemble.core.errors import UsageError
from ensemble.replication.feed import CALL_BYTES  # one traced call's batches
from ensemble.replication import modes

TF_PROCESS = 700 << 20  # resident bytes of a process running TensorFlow and Keras (measured)
LONG_ROW = 64  # bytes of one predictions.parquet row besides its outputs (columns, copies)


def estimate(rows: dict[str, int], n_outputs: int, n_members: int, n_aggregators: int,
             clients: int, member_rows: bool = True) -> dict[str, int]:
    """Bytes a run holds at its largest (all its processes at once), by part.

    Args:
        rows: `{split: rows}`; n_outputs: outputs per row (classes, or 2 for a Gaussian);
        n_members, n_aggregators: models whose predictions are kept;
        clients: TensorFlow processes at once (1 in-graph; between-graph clients).
        member_rows: the members' prediction rows are read whole (between-graph's
            aggregator); always held: the output arrays (float32, plus float64 temporaries
            of the uncertainty and metrics).

    Returns:
        `{"tensorflow", "labels", "predictions", "total"}` in bytes.
    """
    n_eval = rows.get("validation", 0) + rows.get("test", 0)
    n_rows = sum(rows.values())
    models = n_members + n_aggregators
    parts = {
        "tensorflow": clients * TF_PROCESS,
        "labels": 32 * n_rows,
        # the output arrays and their float64 temporaries, and the members' rows read
        "predictions": n_eval * (3 * models * n_outputs * 4 + 3 * n_members * n_outputs * 8)
                       + (n_eval * n_members * (LONG_ROW + 8 * n_outputs) * 2
                          if member_rows else 0),
    }
    # training (the traced calls' batches) and evaluation never coexist, and between-graph's
    # aggregator runs after its clients, without TensorFlow: the larger phase counts
    training = parts["tensorflow"] + clients * 3 * CALL_BYTES
    evaluation = parts["predictions"] + (0 if member_rows else TF_PROCESS)
    parts["total"] = parts["labels"] + max(training, evaluation)
    return parts


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
    raise UsageError(
        f"This run would hold about {memory.gib(need['total'])} ({memory.gib(need['predictions'])}"
        f" of validation and test predictions for {n:,} rows, {clients} TensorFlow "
        f"process{'es' * (clients > 1)} at {memory.gib(TF_PROCESS)}), more than the "
        f"{memory.gib(have)} of {what}; lower data.test_size and data.validation_size "
        "(--set), train fewer --members or fewer clients at once (--jobs), or raise the limit.")


def check_run(cfg, mode: str, devices: list[str], rows: dict[str, int], n_outputs: int) -> None:
    """`check` for a run of config `cfg` in `mode` on `devices` (between-graph: one client per
    device at most, one per member).

    Raises:
        UsageError: the estimate exceeds the memory available (one line).
    """
    members, mode = cfg.members.count, modes.get(mode)
    check(rows, n_outputs, members, len(cfg.aggregation.aggregators),
          mode.processes(members, devices), member_rows=mode.member_files)
