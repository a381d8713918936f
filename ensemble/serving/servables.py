"""Model versions for `ensemble serve`: find, load and swap the versions of one export folder.

`ModelManager` watches `DIR/<version>/` (TF Serving's layout, as `ensemble export` writes it)
and serves the newest version that loads, one copy (replica) per device behind a `Batcher`. A
new version found by the poll thread is loaded beside the served one and becomes the default
when ready; the old one then stops taking requests, finishes those it holds and is unloaded,
so no request fails across the swap. A version that fails to load is reported (state `END`
with its error) and the served one stays; it is retried only when its files change.

A folder is a candidate only when it is complete: `saved_model.pb`, the `variables.index` and
every `variables.data-K-of-N` shard it names, and files unchanged since the previous poll (or
older than `settle` seconds), so a version being copied in is not read half-written.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from ensemble.serving.batching import Batcher, Closed
from ensemble.serving.codec import SignatureInfo, TensorInfo

SHARD = re.compile(r"variables\.data-(\d+)-of-(\d+)$")


class NotFound(LookupError):
    """An unknown model, version or signature (HTTP 404)."""


class NotReady(RuntimeError):
    """No version is loaded yet (HTTP 503)."""


def fingerprint(folder: Path) -> tuple | None:
    """`(relative path, size, mtime_ns)` of every file, or None when the folder is not a
    complete SavedModel yet (no `saved_model.pb`, a missing variables shard)."""
    if not (folder / "saved_model.pb").is_file():
        return None
    try:
        files = sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns)
                       for p in folder.rglob("*") if p.is_file())
        # folders too (`name/`): a copy that keeps old file times (`cp -a`) still changes
        # the times of the folders it is adding files to
        files += sorted((f"{p.relative_to(folder)}/", 0, p.stat().st_mtime_ns)
                        for p in [folder, *folder.rglob("*")] if p.is_dir())
    except OSError:  # a file renamed or removed while listed
        return None
    names = {Path(f).name for f, _, _ in files if f.startswith("variables")
             and not f.endswith("/")}
    if names:
        shards = [SHARD.match(n) for n in names]
        counts = {int(m.group(2)) for m in shards if m}
        if "variables.index" not in names or len(counts) != 1 or \
                sum(1 for m in shards if m) != counts.pop():
            return None
    return tuple(files)


def _tensor_info(spec) -> TensorInfo:
    import tensorflow as tf

    dtype = np.dtype(object) if spec.dtype == tf.string else np.dtype(spec.dtype.as_numpy_dtype)
    shape = None if spec.shape.rank is None else tuple(spec.shape.as_list())
    return TensorInfo(dtype, shape)


def signature_info(fn) -> SignatureInfo:
    """The inputs and outputs of a loaded signature function (read from its TensorSpecs)."""
    _, kwargs = fn.structured_input_signature
    return SignatureInfo({n: _tensor_info(s) for n, s in sorted(kwargs.items())},
                         {n: _tensor_info(s) for n, s in sorted(fn.structured_outputs.items())})


def signature_defs(folder: Path) -> dict:
    """The SignatureDefMap of `folder/saved_model.pb` as TF Serving's metadata JSON shows it
    (`{name: {"inputs": ..., "outputs": ..., "method_name": ...}}`)."""
    from google.protobuf import json_format
    from tensorflow.core.protobuf import saved_model_pb2

    sm = saved_model_pb2.SavedModel.FromString((folder / "saved_model.pb").read_bytes())
    return {name: json_format.MessageToDict(sig, preserving_proto_field_name=True)
            for name, sig in sm.meta_graphs[0].signature_def.items()}


@dataclass(frozen=True)
class Batching:
    """Dynamic batching of a servable's calls (`ensemble.serving.batching.Batcher`).

    Attributes:
        max_batch_size: requests merged into calls of at most this many rows (1: off).
        batch_timeout: seconds a batch waits for more requests while a replica is idle.
        on_batch: called with each call's row count (the metrics), or None.
    """

    max_batch_size: int = 64
    batch_timeout: float = 0.0
    on_batch: Callable[[int], None] | None = None


@dataclass(frozen=True)
class Watch:
    """How the export folder is watched: `poll` seconds between scans; files unchanged for
    `settle` seconds count as complete even without a second scan."""

    poll: float = 1.0
    settle: float = 2.0


class Servable:
    """One loaded version: a replica of the SavedModel on each device, behind a `Batcher`.

    Raises (constructor): whatever `tf.saved_model.load` raises for a damaged folder.
    """

    def __init__(self, folder: Path, version: int, devices: list[str],
                 batching: Batching = Batching()):
        import tensorflow as tf

        self.folder, self.version = folder, version
        self.defs = signature_defs(folder)
        replicas = []
        for device in devices:
            with tf.device(device):
                loaded = tf.saved_model.load(str(folder))
            replicas.append(self._runner(loaded, device))
        first = loaded.signatures
        self.signatures = {n: signature_info(first[n]) for n in sorted(first)}
        self.batcher = Batcher(replicas, batching.max_batch_size, batching.batch_timeout,
                               batching.on_batch)

    @staticmethod
    def _runner(loaded, device: str) -> Callable:
        import tensorflow as tf

        def run(signature: str, inputs: dict) -> dict:
            with tf.device(device):
                out = loaded.signatures[signature](**{k: tf.constant(v)
                                                      for k, v in inputs.items()})
            return {k: v.numpy() for k, v in out.items()}

        run.loaded = loaded  # keeps the replica's variables alive with the runner
        return run

    def submit(self, signature: str, inputs: dict):
        """Queue a request (inputs checked against the signature); a Future of its outputs.
        Raises NotFound (unknown signature), Closed (the version was retired)."""
        sig = self.signatures.get(signature)
        if sig is None:
            raise NotFound(f"signature {signature!r} not found in version {self.version}; "
                           f"signatures: {', '.join(self.signatures)}")
        return self.batcher.submit(signature, inputs, sig.batchable)


@dataclass
class _State:
    state: str  # LOADING, AVAILABLE, END (unloaded, or failed with `error`)
    error: str = ""
    fingerprint: tuple | None = field(default=None, repr=False)


class ModelManager:
    """The versions of model `name` in `base`, the newest loadable one served.

    Args:
        base: the export folder (`base/<version>/`).
        devices: one replica per entry (a device may repeat).
        batching: each version's dynamic batching.
        watch: how often `base` is scanned, when a version's files count as complete.
        log: receives one line per load, swap and failure.
    """

    def __init__(self, base: Path, name: str, devices: list[str],
                 batching: Batching = Batching(), watch: Watch = Watch(),
                 log: Callable[[str], None] = print):
        self.base, self.name, self.devices = Path(base), name, list(devices)
        self.batching, self.log = batching, log
        self.poll_seconds, self.settle = watch.poll, watch.settle
        self.states: dict[int, _State] = {}
        self.current: Servable | None = None
        self._seen: dict[int, tuple] = {}  # version -> (fingerprint, since when unchanged)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def candidates(self) -> list[tuple[int, tuple]]:
        """Complete, settled version folders `(version, fingerprint)`, newest first."""
        found, now = [], time.time()
        for p in self.base.iterdir() if self.base.is_dir() else []:
            if not (p.name.isdigit() and p.is_dir()):
                continue
            fp = fingerprint(p)
            v, (before, since) = int(p.name), self._seen.get(int(p.name), (None, now))
            since = since if fp == before else now  # when its files last changed
            self._seen[v] = (fp, since)
            if fp is None:
                continue
            # complete: unchanged for `settle` seconds, or every time older than that
            settled = now - since >= self.settle or all(now - m / 1e9 >= self.settle
                                                        for _, _, m in fp)
            if settled:
                found.append((v, fp))
        return sorted(found, reverse=True)

    def scan(self) -> None:
        """Load the newest candidate newer than the served version (older ones, newest first,
        while nothing is served); swap it in on success."""
        served = self.current.version if self.current else 0
        for version, fp in self.candidates():
            if version <= served:
                return
            old = self.states.get(version)
            if old and old.state == "END" and old.fingerprint == fp:
                continue  # failed before with these very files
            if self._load(version, fp):
                return

    def _load(self, version: int, fp: tuple) -> bool:
        self.states[version] = _State("LOADING", fingerprint=fp)
        start = time.perf_counter()
        try:
            servable = Servable(self.base / str(version), version, self.devices,
                                self.batching)
        except Exception as exc:  # a damaged export must not stop the server
            text = " ".join(str(exc).split())[:300] or type(exc).__name__
            self.states[version] = _State("END", f"failed to load: {text}", fp)
            still = (f"; still serving version {self.current.version}" if self.current
                     else "")
            self.log(f"version {version} of {self.name} failed to load ({text}){still}")
            return False
        with self._lock:
            old, self.current = self.current, servable
            self.states[version] = _State("AVAILABLE", fingerprint=fp)
        self.log(f"loaded {self.name} version {version} in {time.perf_counter() - start:.1f} s"
                 f" on {len(self.devices)} replica(s); now the default"
                 + (f" (version {old.version} unloading)" if old else ""))
        if old is not None:
            old.batcher.close(wait=True)  # its queued requests finish first
            self.states[old.version] = _State("END", fingerprint=self.states[old.version]
                                              .fingerprint)
        return True

    def start(self) -> None:
        """Scan once now (the first load happens before this returns), then poll."""
        self.scan()
        self._thread = threading.Thread(target=self._poll, daemon=True, name="versions")
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.scan()
            except Exception as exc:  # an unreadable folder is reported, polling goes on
                self.log(f"scanning {self.base}: {exc}")

    def get(self, version: int | None = None) -> Servable:
        """The served version (`version` None or equal to it). Raises NotReady, NotFound."""
        with self._lock:
            cur = self.current
        if cur is None:
            raise NotReady(f"model {self.name} has no version loaded yet")
        if version is not None and version != cur.version:
            raise NotFound(f"version {version} of model {self.name} is not available "
                           f"(served: {cur.version})")
        return cur

    def submit(self, version: int | None, signature: str, inputs: dict):
        """`get(version).submit(...)`, retried on the new default when a swap retires the
        version in between (only for requests that named no version)."""
        while True:
            servable = self.get(version)
            try:
                return servable.submit(signature, inputs)
            except Closed:
                if version is not None:
                    raise NotFound(f"version {version} of model {self.name} was unloaded")

    def status(self, version: int | None = None) -> list[dict]:
        """TF Serving's `model_version_status` entries, newest first. Raises NotFound."""
        states = dict(self.states)
        if version is not None:
            if version not in states:
                raise NotFound(f"version {version} of model {self.name} not found")
            states = {version: states[version]}
        return [{"version": str(v), "state": s.state,
                 "status": {"error_code": "UNKNOWN" if s.error else "OK",
                            "error_message": s.error}}
                for v, s in sorted(states.items(), reverse=True)]

    def stop(self) -> None:
        """Stop polling; the served version finishes its queued requests."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.current is not None:
            self.current.batcher.close(wait=True)
