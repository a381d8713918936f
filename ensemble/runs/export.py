"""Export a trained run as a SavedModel in TensorFlow Serving's layout (`DIR/<version>/`).

The SavedModel is self-contained: a client sends raw, unscaled feature rows and gets the
ensemble's probabilities and the original class labels back, with no Python of this project.

- Signature `serving_default` (the `--aggregator`, default the run's best on validation NLL,
  `ensemble.tasks.choice`) and one signature per aggregator of the
  run, named after it (`mean`, `vote`, `weighted`, ...). A numeric table run's signatures take
  `features`: `[batch, n_features]` float32 in the run's feature order
  (`assets/feature_names.txt`, one name a line; also the `feature_names` variable of the
  loaded object); a run with categorical columns takes one input per column (TF Serving's
  columnar `inputs`: float32 `[batch]` for numeric columns, string `[batch]` for categorical
  ones, named by `input_names`); an array run (images) takes `features` `[batch,
  *input_shape]` float32 raw values (pixels). Each returns
  `probabilities` `[batch, n_classes]` float32, `labels` `[batch]` (the original labels:
  int64 or string, looked up in the `classes` variable; also `assets/classes.txt`), `class_index`
  `[batch]` int64, `member_probabilities` `[batch, n_members, n_classes]` float32 (batch first,
  as TF Serving's row format wants), and `predict`'s uncertainty columns `entropy`,
  `expected_entropy`, `mutual_information` `[batch]` (not for `vote`). A regression run's
  return `mean`, `std`, `aleatoric_std`, `epistemic_std` `[batch]` and `member_mean`,
  `member_std` `[batch, n_members]` (target units).
- Bad values are refused in the graph as `predict` refuses them (`ensemble.data.export_graph`):
  NaN without imputation, inf (or beyond float32), a value that does not fit float32 once
  standardised; the signature fails with `InvalidArgumentError` naming the input.
- In the graph: imputation (the fill values of `preprocessing.json`, when the run imputes),
  one-hot encoding, standardisation in float64 as `Preprocessing.transform` (array runs: the
  members' own first layer scales), every member, and the aggregator's TensorFlow twin
  (`ensemble.tasks.Task.aggregate_tf`) with the parameters of `aggregators.json`.
- No device is hard-wired: members are loaded and the signatures traced under no `tf.device`,
  and TensorFlow's default variable policy saves no device, so the export loads on any machine.

Written with TensorFlow's own `tf.saved_model.save` of a `tf.Module`; the version folder is
written under an owned staging name beside it (`ensemble.core.staging`) and renamed into place, so
TF Serving (which watches `DIR`) never sees a half-written version; staging folders of killed
exports are removed by the next export into `DIR`.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np

from ensemble.core import hooks
from ensemble.config import bounds
from ensemble.runs import run_status
from ensemble.runs import preflight
from ensemble.core import staging
from ensemble.core.manifest import Manifest
from ensemble.runs.context import RunContext
from ensemble.core.errors import UsageError
from ensemble.data import kinds
from ensemble.data.preprocessing import Preprocessing

DEFAULT_SIGNATURE = "serving_default"
FEATURES_ASSET = "feature_names.txt"
CLASSES_ASSET = "classes.txt"
EXPORT_LOCK = ".export.lock"  # serialises exports into one base (kept, like a run's locks)


def next_version(out: Path) -> int:
    """1 + the largest integer version folder in `out` (1 when there is none)."""
    found = [int(p.name) for p in Path(out).glob("*") if p.is_dir() and p.name.isdigit()]
    return max(found, default=0) + 1


def build_module(models, pre: Preprocessing, aggregators, params: dict, default: str, task):
    """The `tf.Module` to save and its signatures.

    Args:
        models: the members' Keras models `[n_members]` (loaded under no device).
        pre: the run's preprocessing (`_input_graph` makes the signature's inputs from it).
        aggregators: the run's aggregator names; `default` among them.
        params: fitted aggregators' parameters `{name: params}` (`aggregators.json`).
        task: the run's task (`ensemble.tasks.for_run`): its `serving_outputs`.

    Returns:
        (module, `{signature name: concrete function}`).
    """
    import tensorflow as tf

    names = list(pre.columns)
    mod = tf.Module()
    mod.members = list(models)
    # variables, not constants, so that the loaded object carries them: `m.feature_names`
    mod.feature_names = tf.Variable(tf.constant(names, tf.string), trainable=False,
                                    name="feature_names")
    classes = pre.classes
    mod.classes = tf.Variable(classes.astype(str) if classes.dtype.kind in "OUS"
                              else classes.astype(np.int64), trainable=False, name="classes")
    spec, to_x, doc = kinds.export_inputs_of(pre)
    mod.lookups = list(getattr(to_x, "resources", []))  # embedded columns' index tables

    def make(aggregator: str):
        def serve(features):
            x = to_x(features)
            stacked = tf.stack([m(x, training=False) for m in mod.members])
            return task.serving_outputs(stacked, aggregator, params.get(aggregator),
                                        mod.classes)

        serve.__doc__ = f"Ensemble ({aggregator}) prediction. {doc}"
        return tf.function(serve, input_signature=[spec]).get_concrete_function()

    sigs = {a: make(a) for a in aggregators}
    sigs[DEFAULT_SIGNATURE] = sigs[default]
    for a, fn in sigs.items():  # keep them reachable on the loaded object too
        setattr(mod, "predict" if a == DEFAULT_SIGNATURE else f"predict_{a}", fn)
    return mod, sigs


def check_out_dir(out: str | Path) -> Path:
    """Check that `out` can be TF Serving's model base folder, before any work.

    Raises:
        UsageError: `out`, or a folder above it, is an existing file (names it).
    """
    out = Path(out)
    try:
        path = Path(os.path.abspath(out))
    except OSError:  # a relative path from a working directory that was deleted
        raise UsageError(f"Cannot resolve --out {str(out)!r}: the working directory no "
                         "longer exists; give an absolute path.") from None
    for q in (path, *path.parents):
        if q.is_dir():
            break
        if q.exists() or q.is_symlink():
            where = "is" if q == path else f"lies under {str(q)!r}, which is"
            raise UsageError(f"Expected --out to be a folder (TF Serving's model base path). "
                             f"Received: {str(out)!r}, which {where} a file")
    return out


def _check_version(version) -> None:
    if version is not None and (isinstance(version, bool) or not isinstance(version, int) or
                                not 1 <= version <= bounds.VERSION_MAX):
        raise UsageError(f"Expected `version` to be an integer in 1..{bounds.VERSION_MAX} "
                         f"(TF Serving's int64). Received: {version!r}")


def _free_target(out: Path, version: int | None) -> Path:
    """`out/<version>` (default: the next free version), refused when it exists."""
    version = next_version(out) if version is None else version
    _check_version(version)
    target = out / str(version)
    if target.exists():
        raise UsageError(f"{target} already exists; choose another --version (next free: "
                         f"{next_version(out)}).")
    return target


def _read_run(run_dir: Path, aggregator: str | None, trust_builder: bool):
    """The run's members (loaded), preprocessing, aggregators, parameters, default aggregator
    and task (the one its manifest records), all read under the run's shared lock
    (`runlock.reading`)."""
    from ensemble.core import runlock
    from ensemble.models.members import load_run_member
    from ensemble.runs.posthoc import run_aggregators
    from ensemble.tasks.choice import default_aggregator
    from ensemble.tasks.classification.fitted import member_params

    with runlock.reading(run_dir):
        manifest = Manifest.load(run_dir)
        run_status.require_completed(run_dir, manifest)
        pre = kinds.run_preprocessing(run_dir, manifest)  # verified, read once
        used = preflight.verify_run(run_dir, manifest, trust_builder, pre=pre)  # before any import
        run = RunContext.open(run_dir, manifest, pre)
        names, fit = run_aggregators(run_dir, manifest)
        aggregator = default_aggregator(names, fit, aggregator)
        models = [load_run_member(run_dir, manifest, i, None) for i in used]
    return models, pre, names, member_params(fit, used), aggregator, run.task


def export_run(run_dir: str | Path, out: str | Path, version: int | None = None,
               aggregator: str | None = None, trust_builder: bool = False) -> Path:
    """Write run `run_dir` as a SavedModel `out/<version>/` for TensorFlow Serving.

    Exports into one `out` at once are serialised by `out/.export.lock` (a `filelock`): each
    gets its own next free version, or a clear refusal when its `version` was taken first.

    Args:
        version: the version folder (an integer >= 1); default: 1 + the largest in `out`.
        aggregator: the aggregator of `serving_default` (default: the run's best on
            validation NLL, `ensemble.tasks.choice.default_aggregator`).
        trust_builder: accept a builder file whose sha256 changed since training and record
            the new one (`preflight.verify_run`; refused otherwise).

    Returns:
        The version folder.

    Raises:
        UsageError: the run is not completed or damaged, the aggregator is not one of the
            run's, `out` is a file, or `out/<version>` already exists.
    """
    from filelock import FileLock

    run_dir, out = Path(run_dir), check_out_dir(out)
    _check_version(version)
    if out.is_dir():
        _free_target(out, version)  # refused at once, before the members load
    models, pre, names, params, aggregator, task = _read_run(run_dir, aggregator, trust_builder)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"Cannot create --out {str(out)!r}: {exc.strerror or exc}") from None
    with FileLock(out / EXPORT_LOCK):
        target = _free_target(out, version)
        staging.sweep(out)  # versions staged by exports that were killed
        _save(models, pre, names, params, aggregator, task, target)
    return target


def _save(models, pre, names, params, aggregator, task, target: Path) -> None:
    """Trace and save the SavedModel under a staging name beside `target`, then rename it."""
    import tensorflow as tf

    tmp = staging.new_path(target, folder=True)
    try:
        texts = {FEATURES_ASSET: "\n".join(pre.columns) + "\n",
                 CLASSES_ASSET: "\n".join(map(str, pre.classes.tolist())) + "\n"}
        assets = tmp / "assets"
        assets.mkdir()
        for name, text in texts.items():
            (assets / name).write_text(text)
        mod, sigs = build_module(models, pre, names, params, aggregator, task)
        mod.assets = [tf.saved_model.Asset(str(assets / name)) for name in texts]
        tf.saved_model.save(mod, str(tmp / "model"), signatures=sigs)
        hooks.fire("write", kind="export", path=target)  # written, not yet renamed into place
        os.replace(tmp / "model", target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
