"""The Ray engine: between-graph members as Ray tasks and in-graph TensorFlow servers as Ray
actors, on a Ray cluster (`placement.engine = "ray"`, `--engine ray`).

An engine decides where clients run; the mode decides what runs. Under this engine:

- between-graph (`train_members`): the prepared splits, preprocessing and manifest go into
  Ray's object store once (`ray.put`); each member is one Ray task (`max_calls=1`: a fresh
  worker process, so TensorFlow's memory is released) with the resources of its placement
  (`num_cpus`; `num_gpus=1` when the cluster has GPUs, Ray then sets
  `CUDA_VISIBLE_DEVICES`), which runs the same member work as a local client
  (`client_work.train_member`) and returns the member's `MemberOutputs` (its `.keras`
  bytes, history, validation and test predictions). Workers never open the run directory:
  the driver writes the member files. A lost node's task is run again by Ray elsewhere
  (`max_retries`); an exception from the member's own code is not retried
  (`retry_exceptions=False`) and is reported in one line naming the member, the node and the
  error. Progress reaches the driver through a `ray.util.queue.Queue` as the local
  launcher's `protocol` lines.
- in-graph (`tensorflow_servers`): one `tf.distribute.Server` per alive node, each in a Ray
  actor pinned to its node; their addresses make the cluster spec that the TensorFlow-cluster
  path (`ensemble.replication.cluster`) places members on.

Members are the same as under the local engine: the same seeds, batch order and threads per
op (`threads`; Ray sets `OMP_NUM_THREADS` to a task's CPUs, and the local launcher sets it to
its client's share the same way).

Ray is an optional dependency (`pip install '.[ray]'` from a checkout), imported only here,
inside the functions.
"""

from __future__ import annotations

import dataclasses
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any, Callable

from ensemble.core import interrupt
from ensemble.core.errors import ClientFailed, UsageError

ENGINES = ("local", "ray")
MAX_RETRIES = 3  # runs of a member's task again after its node or worker died
POLL_SECONDS = 0.2  # how often the driver looks at progress while it waits


class MemberFailed(RuntimeError):
    """A member's own code raised in its Ray task; the message names the member, the node
    and the error. `usage`: the error was bad input (`UsageError`: exit status 2)."""

    def __init__(self, text: str, usage: bool = False):
        super().__init__(text)
        self.usage = usage

    def __reduce__(self):
        return MemberFailed, (str(self), self.usage)


def _ray():
    try:
        import ray
    except ImportError:
        raise UsageError("Expected the `ray` package for --engine ray (pip install "
                         "'ensemble-replication[ray]', or '.[ray]' in a checkout). "
                         "Received: no module named ray") from None
    return ray


def connect(address: str | None = None) -> Any:
    """Connect this process to a Ray cluster: `address` (`host:port` of its head, or `auto`),
    else `$RAY_ADDRESS`, else a local cluster started for this process. Returns the `ray`
    module.

    Raises:
        UsageError: ray is not installed, or no cluster answers at the address (named).
    """
    ray = _ray()
    if ray.is_initialized():
        return ray
    address = address or os.environ.get("RAY_ADDRESS") or None
    try:
        ray.init(address=address, include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR", configure_logging=True)
    except (ConnectionError, ValueError, RuntimeError) as exc:
        raise UsageError(f"Expected a Ray cluster at --address {address} (a head started "
                         f"with `ray start --head`). Received: {str(exc).splitlines()[0]}"
                         ) from None
    return ray


def check(request, mode: str) -> None:
    """Refuse what the Ray engine does not do for a `modes.TrainRequest` of `mode`, before anything
    starts: a TensorFlow cluster spec of its own (the engine starts the servers), the
    data-parallel replicas of a member, TensorBoard scalars of between-graph members (their
    workers never open the run directory) and `--prepare-only`; `placement.address` without
    the Ray engine; the engine without the `ray` package.

    Raises:
        UsageError: names the option and why.
    """
    p, t = request.cfg.placement, request.cfg.training
    if p.engine != "ray":
        if p.address:
            raise UsageError(f"Expected --engine ray with --address {p.address} (the address "
                             f"of a Ray cluster). Received: engine {p.engine!r}")
        return
    reasons = [
        (request.cluster is not None, "--cluster (or TF_CONFIG) does not apply with --engine "
         "ray: it starts the TensorFlow servers on the Ray cluster's nodes itself"),
        (p.replicas not in (1, "1"), "placement.replicas (data-parallel members) applies with "
         "--engine local only"),
        (request.prepare_only, "--prepare-only applies with --engine local only: under "
         "--engine ray the workers never see the run directory"),
        (t.tensorboard and mode == "between-graph", "--tensorboard applies to "
         "--mode between-graph with --engine local only: Ray's workers never open the run "
         "directory")]
    for refused, reason in reasons:
        if refused:
            raise UsageError(reason)
    _ray()  # not installed: refused here, before the run directory is written


def _here(ray) -> Any:
    """A scheduling strategy that pins an actor to this driver's node."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)


class _QueueStream:
    """A text stream whose lines go into a `ray.util.queue.Queue` (a worker's progress)."""

    def __init__(self, queue):
        self.queue = queue

    def write(self, text: str) -> int:
        for line in text.splitlines():
            self.queue.put(line)
        return len(text)

    def flush(self) -> None:
        pass


def _node() -> tuple[str, str]:
    """(node id, node IP address) of the Ray node running this worker."""
    import ray

    return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()


def _member_task(payload: dict, index: int, threads: int, queue) -> dict:
    """Train member `index` in this (fresh) Ray worker from `payload` (`train_members`'s);
    returns `{"outputs": MemberOutputs or the epoch it diverged, "node", "node_ip",
    "device", "gpus", "ready_unix", "work_seconds", "peak_rss_bytes", "tensorflow_build",
    "steady": [rows, seconds], "spans"}`.

    Raises:
        MemberFailed: the member's code raised (names the member, the node and the error).
    """
    import tempfile

    import ray

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    node, ip = _node()
    queue.put({"started": index, "node": node, "ip": ip})
    try:
        return _train_here(payload, index, threads, queue, node, ip, tempfile, ray)
    except Exception as exc:  # the member's own code: reported, never retried blindly
        from ensemble.core.notices import one_line

        raise MemberFailed(one_line(f"member {index} failed on node {node} ({ip}): "
                                    f"{type(exc).__name__}: {exc}"),
                           isinstance(exc, UsageError)) from None


def _train_here(payload, index, threads, queue, node, ip, tempfile, ray) -> dict:
    from ensemble.config import schema
    from ensemble.core.manifest import Manifest
    from ensemble.core.tfimport import import_tensorflow_quietly
    from ensemble.replication import devices, progress
    from ensemble.replication.client_work import MemberWork, train_member
    from ensemble.replication.steady import SteadyState

    import_tensorflow_quietly()
    import tensorflow as tf

    ready, start = time.time(), time.perf_counter()
    manifest = Manifest.from_dict(payload["manifest"])
    cfg = schema.from_dict(manifest.config)
    devices.set_threads(cfg.training.intra_op_threads or threads, threads)  # as a local client
    devices.configure(cfg)
    gpus = [str(g) for g in ray.get_gpu_ids()]
    device = "/device:GPU:0" if gpus and tf.config.list_physical_devices("GPU") \
        else "/device:CPU:0"
    steady = SteadyState(cfg.training.batch_size, manifest.dataset.rows["train"])
    callbacks = [progress.ReportProgress([index], _QueueStream(queue)), steady]
    with tempfile.TemporaryDirectory(prefix=f"ensemble-member-{index}-") as tmp:
        work = MemberWork(manifest, cfg, payload["split"], payload["pre"], Path(tmp))
        outputs = train_member(work, index, device, callbacks)
    return {"outputs": outputs, "node": node, "node_ip": ip, "device": device, "gpus": gpus,
            "ready_unix": ready, "work_seconds": time.perf_counter() - start,
            "peak_rss_bytes": devices.peak_rss_bytes(),
            "tensorflow_build": devices.build_info(),
            "steady": [steady.rows, steady.seconds], "spans": steady.spans}


def member_resources(ray, threads: int) -> dict:
    """The Ray resources of one member's task: `num_cpus` = its `threads`, and `num_gpus=1`
    when the cluster has GPUs (Ray then sets the worker's `CUDA_VISIBLE_DEVICES`)."""
    gpus = ray.cluster_resources().get("GPU", 0)
    return {"num_cpus": threads, "num_gpus": 1 if gpus >= 1 else 0}


def tasks_at_once(threads: int, members: int, jobs: int | None = None) -> int:
    """How many member tasks of `threads` CPUs each the connected cluster runs at once: its
    CPUs over `threads`, at most `members` and `jobs`, at least 1."""
    import ray

    cpus = int(ray.cluster_resources().get("CPU", 1))
    return max(1, min(cpus // threads, members, jobs or members))


@dataclasses.dataclass
class MemberRun:
    """What the driver learnt about one member's task: the nodes it started on (`starts`,
    more than one when Ray ran it again), and its result or failure line."""

    index: int
    starts: list[str] = dataclasses.field(default_factory=list)
    result: dict | None = None
    error: str | None = None
    usage: bool = False


def train_members(payload: dict, members: list[int], threads: int,
                  on_line: Callable[[str], Any], on_done: Callable[[int, dict], None],
                  verbosity: int = 1, jobs: int | None = None,
                  max_retries: int = MAX_RETRIES) -> dict[int, MemberRun]:
    """Train `members` as Ray tasks on the connected cluster (`connect` first) and hand
    each result to `on_done(index, result)` (`_member_task`'s dict) as it arrives.

    Args:
        payload: `{"manifest": the run's manifest as JSON, "split": split -> (x, y, rows),
            "pre": the preprocessing}`, put into the object store once.
        threads: each task's CPUs, TensorFlow inter-op threads and intra-op ones when
            `training.intra_op_threads` is 0.
        on_line: gets every `protocol` progress line of the workers.
        jobs: tasks in flight at once (None: every member; Ray queues them by resources).
        max_retries: runs of a task again when its node or worker dies.

    Returns:
        member index -> its `MemberRun`.

    Raises:
        interrupt.Interrupted: SIGINT/SIGTERM: the running tasks are cancelled; the members
            handed to `on_done` are kept.
        UsageError / ClientFailed: members failed (every failure line joined); the others
            ran to their end first.
    """
    from ray.util.queue import Queue

    ray = _ray()
    ref = ray.put(payload)
    queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": _here(ray)})
    task = ray.remote(max_calls=1)(_member_task).options(
        **member_resources(ray, threads), max_retries=max_retries, retry_exceptions=False)
    runs = {i: MemberRun(i) for i in members}
    waiting, pending = list(members), {}
    limit = jobs or len(members)

    def drain() -> None:
        while not queue.empty():
            for item in queue.get_nowait_batch(queue.qsize()):
                if isinstance(item, dict):
                    runs[item["started"]].starts.append(item["node"])
                    if verbosity:
                        print(f"member {item['started']}: started on node {item['node']} "
                              f"({item['ip']})", flush=True)
                else:
                    on_line(item)

    try:
        with interrupt.deferred():
            while waiting or pending:
                while waiting and len(pending) < limit:
                    i = waiting.pop(0)
                    pending[task.remote(ref, i, threads, queue)] = i
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=POLL_SECONDS)
                drain()
                if interrupt.requested() is not None:
                    break
                for r in ready:
                    _collect(ray, r, runs[pending.pop(r)], on_done, verbosity)
        drain()
    finally:
        for r in pending:
            ray.cancel(r, force=True)
        ray.kill(queue.actor)
    if interrupt.requested() is not None:
        raise interrupt.Interrupted(interrupt.requested())
    failed = [r for r in runs.values() if r.error]
    if failed:
        text = "; ".join(r.error for r in failed)
        raise (UsageError if all(r.usage for r in failed) else ClientFailed)(text)
    return runs


def _collect(ray, ref, run: MemberRun, on_done, verbosity: int) -> None:
    """The result of one finished task into `run` (and `on_done`), or its failure line."""
    try:
        run.result = ray.get(ref)
    except ray.exceptions.RayTaskError as exc:
        cause = exc.cause if isinstance(exc.cause, MemberFailed) else None
        run.error = str(cause) if cause else f"member {run.index} failed: {exc}".splitlines()[0]
        run.usage = bool(cause and cause.usage)
    except ray.exceptions.RayError as exc:  # its node or worker died more than max_retries
        run.error = (f"member {run.index}: its Ray task was lost "
                     f"({type(exc).__name__}: {str(exc).splitlines()[0]})")
    if run.error:
        print(f"error: {run.error}", file=sys.stderr, flush=True)
        return
    on_done(run.index, run.result)
    if verbosity:
        r = run.result
        print(f"member {run.index}: trained on node {r['node']} ({r['node_ip']}) "
              f"{r['device']} in {r['work_seconds']:.1f} s", flush=True)


class _ServerActor:
    """A Ray actor holding one `tf.distribute.Server` of an in-graph run's cluster."""

    def reserve(self) -> str:
        """A free `ip:port` on this node for the server."""
        with socket.socket() as s:
            s.bind(("", 0))
            port = s.getsockname()[1]
        return f"{_node()[1]}:{port}"

    def start(self, spec: dict, index: int, deterministic: bool) -> list[str]:
        """Start task `worker:index` of `spec`; returns its devices' names."""
        from ensemble.core.tfimport import import_tensorflow_quietly

        import_tensorflow_quietly()
        import tensorflow as tf

        if deterministic:
            tf.config.experimental.enable_op_determinism()
        self.server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name="worker",
                                           task_index=index, protocol="grpc", start=True)
        return [d.name for d in tf.config.list_logical_devices()]

    def node(self) -> str:
        return _node()[0]


class TensorFlowServers:
    """The TensorFlow servers of an in-graph run on the Ray cluster: one per alive node
    (`tf.distribute.Server` in a Ray actor pinned to the node, holding no Ray CPU: the run's
    graph is its only work), job `worker`; each says in one line on stderr that it listens
    on every interface (`cluster.exposure_warning`). A context manager that ends the actors
    on exit.

    Attributes:
        spec: the cluster spec `{"worker": ["ip:port", ...]}`.
        nodes: `[n_tasks]` Ray node ids, task order.
    """

    def __init__(self, deterministic: bool = True):
        from ensemble.replication.cluster import exposure_warning

        ray = _ray()
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        alive = [n for n in ray.nodes() if n.get("Alive")]
        actor = ray.remote(_ServerActor)
        self.actors = [actor.options(
            num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], False)
        ).remote() for n in alive]
        self.nodes = [n["NodeID"] for n in alive]
        self.spec = {"worker": ray.get([a.reserve.remote() for a in self.actors])}
        for addr in self.spec["worker"]:
            print(exposure_warning(addr), file=sys.stderr, flush=True)
        ray.get([a.start.remote(self.spec, i, deterministic) for i, a in enumerate(self.actors)])

    def __enter__(self) -> "TensorFlowServers":
        return self

    def __exit__(self, *exc) -> None:
        ray = _ray()
        for a in self.actors:
            ray.kill(a)
