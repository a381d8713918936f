"""A search run's selection against its references (`ensemble evaluate` of an `ensemble search`
run): pure analysis of the stored member predictions, no training.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from ensemble.tasks.classification import aggregators
from ensemble.core import artifacts
from ensemble.core.manifest import Manifest
from ensemble.tasks.classification import metrics
from ensemble.runs import members_table, posthoc, run_status
from ensemble.runs.context import RunContext
from ensemble import tasks
from ensemble.tasks import model_arrays
from ensemble.core.errors import UsageError


def selected(run_dir: Path, manifest: Manifest | None = None) -> dict[int, float]:
    """`{member index: weight}` of the members a run's selection kept: the fitted parameters
    of its task's selecting aggregator (`Task.selected`, greedy selection) in
    `aggregators.json`. `manifest`: the run's, when the caller holds it.

    Raises:
        UsageError: the run has no fitted selection.
    """
    from ensemble.tasks.classification import fitted

    manifest = manifest if manifest is not None else Manifest.load(run_dir)
    fit = fitted.read(run_dir) or {}
    sel = tasks.for_run(manifest).selected(fit)
    if sel is None:
        raise UsageError(f"Run {run_dir} has no greedy selection in {fitted.FILENAME}.")
    return {i: w for i, w in zip(fit["members"], sel["weights"]) if w > 0}


def _split_probs(run_dir: Path, manifest: Manifest) -> dict[str, posthoc.SplitMembers]:
    """The members' labelled rows of every split of a run's predictions (`posthoc.by_split`'s,
    read a record batch at a time: `model_arrays.read`).

    Raises:
        UsageError: as `artifacts.verify`; members whose rows of a split do not line up.
    """
    preds = model_arrays.read(artifacts.verify(run_dir, manifest, run_dir / artifacts.PREDICTIONS),
                              tasks.for_run(manifest), source_rows=True)
    out = {}
    for split in preds.splits:
        members = sorted((a.by_row() for a in preds.of_split(split) if a.member is not None),
                         key=lambda a: a.member)
        if not members:
            continue
        first = members[0]
        for a in members[1:]:
            if not np.array_equal(a.source_row, first.source_row):
                raise UsageError(f"Rows of member {a.member} on split {split!r} do not match "
                                 "the other members' rows.")
        out[split] = posthoc.SplitMembers([a.member for a in members],
                                          np.stack([a.values for a in members]),
                                          first.source_row, None if first.unlabelled else first.y)
    return out


def comparison(run_dir: str | Path, manifest: Manifest | None = None) -> list[dict[str, Any]]:
    """The search's selection against its references on every labelled split: the plain
    ensemble of the same size budget (the mean of the first K candidates, K = `--select`:
    random hyperparameters, no selection) and the best single candidate (lowest validation
    NLL).

    Returns:
        Rows `{split, model, n_members, accuracy, nll, brier, ece}`; [] for a run that is
        not a search. `manifest`: the run's, when the caller holds it.
    """
    run_dir = Path(run_dir)
    manifest = manifest if manifest is not None else Manifest.load(run_dir)
    info = manifest.search
    if not info:
        return []
    weights = selected(run_dir, manifest)
    own = _split_probs(run_dir, manifest)
    cands = own
    if info.get("candidates_run"):
        cands_dir = run_dir / info["candidates_run"]
        cands = _split_probs(cands_dir, Manifest.load(cands_dir))
    n, k = len(weights), min(int(info["select"]), len(cands["validation"].members))
    val = cands["validation"]
    best = val.members[int(np.argmin([metrics.nll(val.y, p) for p in val.probs]))]
    out = []
    for split in ("validation", "test"):
        if split not in own or own[split].y is None:
            continue
        s, c = own[split], cands[split]
        if not np.array_equal(s.rows, c.rows):
            raise UsageError(f"The candidates' {split} rows differ from the run's.")
        w = [weights.get(i, 0.0) for i in s.members]
        firsts = [j for j, i in enumerate(c.members) if i < k]
        models = [(f"selected (greedy, {n} of {len(s.members)})", n,
                   aggregators.weighted(s.probs, w)),
                  (f"mean of first {k} candidates", k,
                   aggregators.soft_vote(c.probs[firsts])),
                  (f"best candidate (member-{best})", 1, c.probs[c.members.index(best)])]
        out += [{"split": split, "model": name, "n_members": k, **metrics.all_metrics(s.y, p)}
                for name, k, p in models]
    return out


def record_search(run_dir: str | Path, info: dict[str, Any]) -> Manifest:
    """Record search `info` (seed, space, candidates, select, stratify) in the run's manifest,
    write `members.parquet` and finish the run (`completed`, every artifact's sha256);
    returns the manifest. Call it holding the run (the search's driver)."""
    manifest = Manifest.load(run_dir)
    manifest.search = info
    members_table.write(RunContext.open(run_dir, manifest))
    run_status.finish(Path(run_dir), manifest, "completed")
    return manifest
