"""`ensemble search`: a hyperparameter ensemble (Wenzel et al. 2020) by random search and
greedy ensemble selection, on the ordinary training path.

1. N candidates are sampled from the config's `[search]` space (`ensemble.config.search_space`) and become
   the `[[members.override]]` of ONE run, trained by `api.train` in either replication mode
   across the devices (no second trainer: resume, faults, placement and records are the
   run's).
2. That run's `greedy` aggregator (ensemble selection with replacement, Caruana et al. 2004)
   runs `K` rounds on validation NLL: the selection of at most K candidates. `greedy` is the
   run's first aggregator and `aggregators.json` holds its weights, so `predict` and `aggregate`
   apply exactly that selection (`ensemble-greedy` rows).
3. With `--stratify S`, every selected configuration is trained again with S new member
   seeds (run seed + 1) as a second run in `--run-dir`, the candidates' run moving to
   `RUN/candidates/`, and greedy selection runs again over those `S x selected` members.

The run's manifest records the search (`search`: seed, space, candidates, select, stratify).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ensemble.core import artifacts, runlock
from ensemble.config import schema
from ensemble.runs import prepare, run_status
from ensemble.runs import search_report
from ensemble.core.manifest import Manifest
from ensemble.runs.search_report import selected
from ensemble.config import search_space as S
from ensemble.config.changes import resume_changes
from ensemble.core.errors import UsageError

CANDIDATES_DIR = "candidates"


@dataclass
class Plan:
    """A checked search: the candidates' run config and what produced it."""

    seed: int
    space: dict[str, Any]
    raw: dict[str, Any]
    base: dict[str, Any]  # the config tables without [search], flags applied
    candidates: list[dict[str, Any]]
    select: int
    stratify: int
    config: schema.Config  # the candidates' run


def plan(config_path: str | Path, candidates: int, select: int, stratify: int = 0,
         overrides: dict[str, Any] | None = None) -> Plan:
    """Check the space and build the candidates' run config; no TensorFlow.

    Raises:
        UsageError: a bad `[search]` table (names the key), config or count.
    """
    seed, space, raw = S.load_space(config_path)
    for key in space:  # the config key a `[search]` key sets for every candidate
        dotted = f"training.{key}" if key == "learning_rate" else f"members.{key}"
        if (overrides or {}).get(dotted) is not None:
            flag = "--learning-rate" if key == "learning_rate" else f"--set {dotted}"
            raise UsageError(f"Expected no {flag}: [search] samples `{key}` for every "
                             "candidate, so the flag would be recorded and not used; leave it "
                             f"out, or take `{key}` out of [search].")
    if stratify < 0:
        raise UsageError(f"Expected --stratify >= 0. Received: {stratify}")
    base = schema.load(config_path, overrides=overrides).to_dict()
    cands = S.sample(space, seed, candidates)
    cfg = schema.from_dict(S.candidate_tables(base, cands, select))
    return Plan(seed, space, raw, base, cands, select, stratify, cfg)


@dataclass(frozen=True)
class SearchOptions:
    """How `run_search` trains its runs: the replication `mode`; `resume` keeps completed
    runs and resumes unfinished ones; `overwrite` replaces runs already there; `jobs` clients
    at once (between-graph); `verbosity` 0 quiet, 1 progress lines (`ensemble.train`'s)."""

    mode: str = "in-graph"
    resume: bool = False
    overwrite: bool = False
    jobs: int | None = None
    verbosity: int = 1


def _train(cfg: schema.Config, run_dir: Path, o: SearchOptions) -> None:
    """One run on the ordinary path; with `o.resume`, a completed run is kept and an
    unfinished one resumes (only its unfinished members / from its checkpoint)."""
    from ensemble.runs import api

    same = ("A search's --config, --candidates, --select, --stratify, --epochs, --devices "
            "and --set make its runs' configs: resume with the ones it started with.")
    if o.resume and (run_dir / artifacts.MANIFEST).is_file():
        manifest = Manifest.load(run_dir)
        if run_status.effective_status(manifest) == "completed":  # kept, if it is this search's
            run_cfg = prepare.run_config(cfg, manifest)
            changes = resume_changes(manifest.config, run_cfg.to_dict())
            if changes:
                raise UsageError(f"Config changed since run {run_dir} was trained "
                                 f"({'; '.join(changes)}). {same}")
            return
        try:
            api.train(cfg, o.mode, run_dir, resume=True, jobs=o.jobs, verbosity=o.verbosity)
        except UsageError as exc:
            if "Config changed since run" not in str(exc):
                raise
            raise UsageError(f"{exc} {same}") from None
    else:
        api.train(cfg, o.mode, run_dir, overwrite=o.overwrite, jobs=o.jobs,
                  verbosity=o.verbosity)


def _record(run_dir: Path, info: dict[str, Any]) -> Manifest:
    """Add the search to the run's manifest, write `members.parquet`, refresh the hashes
    (`search_report.record_search`)."""
    return search_report.record_search(run_dir, info)


def run_search(p: Plan, run_dir: Path, options: SearchOptions = SearchOptions()) -> Path:
    """Train the candidates (and, with stratification, the selected ones again) and record
    the search, as `options` say; returns `run_dir`, the run whose selection `predict`
    applies.

    Raises:
        UsageError: `run_dir` already holds a run (without `overwrite`/`resume`), another
        process writes it, or a run to resume was started with another config or mode. An
        old run is removed only once training has checked the config and data (nothing of
        it is lost on a refusal).
    """
    run_dir = Path(run_dir)
    cand_dir = run_dir / CANDIDATES_DIR if p.stratify else run_dir
    if options.resume and not any((d / artifacts.MANIFEST).is_file()
                                  for d in (run_dir, cand_dir)):
        raise UsageError(f"Not a run directory (no manifest.json): {str(run_dir)!r}; nothing to "
                         "resume (leave out --resume to start a search there).")
    if not options.resume:  # refuse before any training; an old run is replaced only by
        for d in {run_dir, cand_dir}:  # training, after its checks of the config and data
            if prepare.holds_run(d, options.overwrite):
                runlock.require_free(d)  # not while another process reads or writes it
    info = {"seed": p.seed, "space": p.raw, "candidates": len(p.candidates),
            "select": p.select, "stratify": p.stratify}
    _train(p.config, cand_dir, options)
    _record(cand_dir, info)
    if not p.stratify:
        return run_dir
    if not options.resume and prepare.holds_run(run_dir, options.overwrite):
        # the old stratified run goes, but not the candidates just trained inside it
        with prepare.writing(run_dir, "search"):
            prepare.clear_run_dir(run_dir, keep=(CANDIDATES_DIR,))
    chosen = sorted(selected(cand_dir))
    source = [c for c in chosen for _ in range(p.stratify)]
    tables = S.candidate_tables(p.base, [p.candidates[c] for c in source], p.select,
                                seed_offset=S.STRATIFY_SEED_OFFSET)
    _train(schema.from_dict(tables), run_dir, options)
    _record(run_dir, {**info, "candidate": source, "candidates_run": CANDIDATES_DIR})
    return run_dir
