"""Upper bounds of a run config's numbers: the largest values a run can use (beyond them:
memory, integer overflow in seeds, divergence), checked by `ensemble.config.schema` after types and
finiteness, before anything is written.
"""

from __future__ import annotations

import math
from typing import Any

from ensemble.core.errors import UsageError


SEED_MAX = 2 ** 32 - 1  # scikit-learn's random_state, NumPy's legacy seeds
UPPER = {  # key -> the largest value a run can use (beyond: memory, overflow, divergence)
    "members.count": 10_000, "training.epochs": 1_000_000, "training.batch_size": 2 ** 31 - 1,
    "training.checkpoint_every": 2 ** 31 - 1, "training.steps_per_execution": 2 ** 31 - 1,
    "training.intra_op_threads": 4096,
    "training.learning_rate": 10.0, "members.l2": 100.0, "training.seed": SEED_MAX,
    "training.min_delta": 1000.0,  # a validation-loss drop (nats per row): beyond, nothing improves
    "data.split_seed": SEED_MAX, "data.synthetic.seed": SEED_MAX,
    "data.synthetic.rows": 100_000_000, "data.synthetic.features": 100_000,
    "data.synthetic.classes": 10_000, "placement.memory_limit_mb": 2 ** 31 - 1,
    "aggregation.greedy_rounds": 1_000_000, "aggregation.stacking_folds": 100,
}
WIDTH_MAX = 2 ** 20  # units of one hidden layer


def check_bounds(cfg) -> None:
    """Upper bounds of every numeric key (`UPPER`), hidden widths, per-member overrides, the
    weights' sum and the synthetic source's own constraints.

    Raises:
        UsageError: names the key, its bound and the value received.
    """
    def at_most(key: str, value: float, bound: float) -> None:
        if value > bound:
            # whole bounds whole (4,294,967,295, not 4.29497e+09)
            shown = f"{int(bound):,}" if float(bound).is_integer() else f"{bound:g}"
            raise UsageError(f"Expected `{key}` <= {shown}. Received: {key}={value!r}")

    for key, bound in UPPER.items():
        node: Any = cfg
        for part in key.split("."):
            node = getattr(node, part)
        if not isinstance(node, str):  # "auto" (batch size, early stopping): checked as such
            at_most(key, node, bound)
    for i, width in enumerate(cfg.members.hidden):
        at_most(f"members.hidden[{i}]", width, WIDTH_MAX)
    for k, o in enumerate(cfg.members.override):
        for i, width in enumerate(o.hidden or ()):
            at_most(f"members.override[{k}].hidden[{i}]", width, WIDTH_MAX)
        if o.learning_rate is not None:
            at_most(f"members.override[{k}].learning_rate", o.learning_rate,
                    UPPER["training.learning_rate"])
        if o.l2 is not None:
            at_most(f"members.override[{k}].l2", o.l2, UPPER["members.l2"])
    if isinstance(cfg.placement.devices, str):  # the same bound as every command's --devices
        check_devices(cfg.placement.devices, "placement.devices")
    if isinstance(cfg.placement.replicas, int):
        at_most("placement.replicas", cfg.placement.replicas, REPLICAS_MAX)
    if not math.isfinite(sum(cfg.aggregation.weights)):
        raise UsageError("Expected `aggregation.weights` to have a finite sum. Received: "
                         f"{list(cfg.aggregation.weights)}")
    syn = cfg.data.synthetic
    if syn.classes < 2 or 2 * syn.classes > 2 ** max(2, syn.features // 2):
        raise UsageError("Expected `data.synthetic.classes` >= 2 and at most "
                         "2 ** max(2, features // 2) / 2 (two clusters per class in the "
                         f"informative features). Received: classes={syn.classes}, "
                         f"features={syn.features}")


# Upper bounds of the command-line options that size work or memory, the same in every
# command (`pipelines.options` checks them while parsing, before anything loads or is written).
INT64_MAX = 2 ** 63 - 1
VERSION_MAX = INT64_MAX  # TF Serving reads a model version folder as int64
LOGICAL_CPU_MAX = 256  # `--devices cpu:N`: each logical device has its own thread pools
REPLICAS_MAX = 256  # copies of a model (serve) or of each member (train, predict)
BATCH_ROWS_MAX = 2 ** 24  # `--batch-size` rows read and predicted at a time (predict, client)
SERVE_BATCH_MAX = 65_536  # `serve --max-batch-size`: rows merged into one call
BATCH_TIMEOUT_MS_MAX = 60_000.0  # `serve --batch-timeout-ms`
JOBS_MAX = 1024  # concurrent client processes, TensorFlow threads
PORT_MAX = 65_535
REQUEST_BYTES_DEFAULT = 64 * 2 ** 20  # serve --max-request-bytes (TF Serving's gRPC: 4 MiB)
REQUEST_BYTES_MAX = 2 ** 31 - 1
REQUEST_ROWS_DEFAULT = 65_536  # serve --max-request-rows
REQUEST_ROWS_MAX = 2 ** 24
# (a request body's JSON nesting: ensemble.serving.limits.JSON_DEPTH_MAX)


def check_devices(spec: str, flag: str = "--devices") -> str:
    """A device spec as every command takes it: `auto`, `cpu:N` with 1 <= N <=
    `LOGICAL_CPU_MAX`, or device names; the empty string is refused, never taken as `auto`.

    Raises:
        UsageError: names the value and what was expected.
    """
    text = spec.strip() if isinstance(spec, str) else spec
    if not isinstance(text, str) or not text:
        raise UsageError(f"Expected `{flag}` to be auto, cpu:N or device names such as "
                         f"/GPU:0,/GPU:1. Received: {flag}={spec!r}")
    if text.startswith("cpu:"):
        n = text[4:]
        if not n.isdigit() or not 1 <= int(n) <= LOGICAL_CPU_MAX:
            form = f"{flag} cpu:N" if flag.startswith("--") else f"{flag}='cpu:N'"
            raise UsageError(f"Expected `{form}` with N in 1..{LOGICAL_CPU_MAX} "
                             f"(logical CPU devices). Received: {flag}={spec!r}")
    return text


def check_int(value, flag: str, low: int, high: int) -> int:
    """`value` (an int or its text) as an integer in `low..high`.

    Raises:
        UsageError: not an integer or out of range (names `flag`, the range and the value).
    """
    text = str(value).strip()
    ok = text.lstrip("-").isdigit() and not isinstance(value, bool)
    if not ok or not low <= int(text) <= high:
        raise UsageError(f"Expected `{flag}` to be an integer in {low}..{high}. "
                         f"Received: {value!r}")
    return int(text)


def check_float(value, flag: str, low: float, high: float) -> float:
    """`value` (a number or its text) as a finite float in `[low, high]`.

    Raises:
        UsageError: not a number, not finite or out of range.
    """
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or not low <= number <= high:
        raise UsageError(f"Expected `{flag}` to be a finite number in [{low:g}, {high:g}]. "
                         f"Received: {value!r}")
    return number


TARGET_SCALE_MAX = 1e15  # a regression target's std: the head's variance is scale^2 in float32


def check_target_scale(loc: float, scale: float, name: str) -> None:
    """Refuse a regression target whose training-split spread the float32 head cannot carry:
    the predictive variance is `scale^2 * v`, which overflows float32 (3.4e38) for a std
    beyond about 1.8e19 and loses the member to divergence well before (`TARGET_SCALE_MAX`).

    Raises:
        UsageError: names the target, its mean and std, and the fix (rescale it).
    """
    if not (math.isfinite(loc) and math.isfinite(scale)) or scale > TARGET_SCALE_MAX:
        raise UsageError(f"Target {name!r} spreads too widely for float32 training (mean "
                         f"{loc:.3g}, std {scale:.3g}; expected std <= {TARGET_SCALE_MAX:g}); "
                         "rescale it, e.g. divide it by a power of ten.")


DEPTH_MAX = 32  # nesting of arrays and inline tables in a config or `--set` value


def check_depth(text: str, what: str, limit: int = DEPTH_MAX) -> str:
    """Refuse TOML `text` whose arrays and inline tables nest deeper than `limit`, before it
    is parsed (Python's parser recurses per level: a few thousand levels raise
    `RecursionError`). Brackets inside quoted strings and comments are not counted.

    Returns:
        `text`.

    Raises:
        UsageError: names `what` (the file or the `--set` item), the depth and the limit.
    """
    depth = deepest = 0
    quote = None
    comment = escaped = False
    for ch in text:
        if comment:
            comment = ch != "\n"
        elif quote:
            if escaped:
                escaped = False
            elif ch == "\\" and quote == '"':  # basic strings escape; literal ones do not
                escaped = True
            elif ch == quote:
                quote = None
        elif ch in "\"'":
            quote = ch
        elif ch == "#":
            comment = True
        elif ch in "[{":
            depth += 1
            if depth > deepest:
                deepest = depth
                if deepest > limit:
                    raise UsageError(f"Expected {what} to nest arrays and tables at most "
                                     f"{limit} deep. Received: more than {limit} levels")
        elif ch in "]}":
            depth = max(depth - 1, 0)
    return text
