"""TensorFlow clusters: cluster specs, `ensemble server` tasks, and connecting a client.

The engine is TensorFlow's own gRPC runtime (`tf.distribute.Server`, `tf.train.ClusterSpec`,
`tf.config.experimental_connect_to_cluster`). Its servers have NO authentication and run any
graph they are sent: keep them on a loopback or isolated private network.
"""

from __future__ import annotations

import ipaddress
import json
import os
import signal
import socket
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from ensemble.core.errors import UsageError

PROBE_SECONDS = 5.0
HUNG_SECONDS = 30.0  # no gRPC handshake from a task for this long: the task is hung
WATCH_EVERY_SECONDS = 5.0


class ClusterError(RuntimeError):
    """A task of the cluster cannot be reached; the message names it."""


def load_spec(path: str | Path | None) -> dict[str, list[str]] | None:
    """The cluster spec from a JSON file, else from `TF_CONFIG["cluster"]`, else None.

    Raises:
        UsageError: unreadable file, or not a `{job: ["host:port", ...]}` dict.
    """
    if path is not None:
        try:
            spec = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise UsageError(f"Cluster file not found: {path}") from None
        except (OSError, ValueError) as exc:
            raise UsageError(f"Cluster file {path} is not valid JSON: {exc}") from None
        source = str(path)
    elif os.environ.get("TF_CONFIG"):
        try:
            spec = json.loads(os.environ["TF_CONFIG"]).get("cluster")
        except (ValueError, AttributeError):
            raise UsageError("TF_CONFIG is not a JSON object with a `cluster` key.") from None
        source = "TF_CONFIG"
        if spec is None:
            return None
    else:
        return None
    ok = isinstance(spec, dict) and spec and all(
        isinstance(j, str) and isinstance(a, list) and a
        and all(isinstance(x, str) and x.rpartition(":")[2].isdigit() for x in a)
        for j, a in spec.items())
    if not ok or "localhost" in spec:
        raise UsageError(f'Expected a cluster spec such as {{"worker": ["127.0.0.1:2222"]}} '
                         f"(job names other than localhost) in {source}. Received: {spec!r}")
    return spec


def tasks(spec: dict) -> list[tuple[str, int, str]]:
    """`[(job, task index, "host:port"), ...]` of a spec (full, or sparse `{job: {i: addr}}`)."""
    return [(job, int(i), addr) for job, addrs in spec.items()
            for i, addr in (addrs.items() if isinstance(addrs, dict) else enumerate(addrs))]


def task_of(spec: dict[str, list[str]], device: str) -> dict:
    """The sparse spec `{job: {index: addr}}` of the task that owns `device`: a between-graph
    client connects to its own task only, so other tasks being down does not stop it."""
    import tensorflow as tf

    d = tf.DeviceSpec.from_string(device)
    return {d.job: {d.task or 0: spec[d.job][d.task or 0]}}


def unreachable(spec: dict, timeout: float = PROBE_SECONDS) -> list[str]:
    """Tasks whose address refuses a TCP connection: `["worker:1 (127.0.0.1:2223)", ...]`."""
    down = []
    for job, i, addr in tasks(spec):
        host, _, port = addr.rpartition(":")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=timeout).close()
        except OSError:
            down.append(f"{job}:{i} ({addr})")
    return down


def check(spec: dict) -> None:
    """Raises ClusterError naming every task that cannot be reached."""
    down = unreachable(spec)
    if down:
        raise ClusterError(f"cluster task unreachable: {', '.join(down)}; start it with "
                           "`ensemble server --cluster FILE --task JOB:I`")


def connect(spec: dict) -> list[str]:
    """Connect this client to the cluster and list the devices of its tasks.

    Returns:
        Remote device names (`/job:worker/replica:0/task:1/device:CPU:0`), GPUs when any
        task has one, else every task's first CPU.

    Raises:
        ClusterError: a task is unreachable (named).
    """
    check(spec)
    import tensorflow as tf

    tf.config.experimental_connect_to_cluster(tf.train.ClusterSpec(spec))
    remote = [d for d in tf.config.list_logical_devices() if "/job:localhost" not in d.name
              and d.name.startswith("/job:")]
    gpus = [d.name for d in remote if d.device_type == "GPU"]
    return gpus or [d.name for d in remote if d.device_type == "CPU" and d.name.endswith(":0")]


def answers(addr: str, timeout: float) -> bool:
    """Whether the gRPC server at `addr` completes a connection handshake (HTTP/2 settings,
    answered by the server process itself) within `timeout` seconds. A stopped (SIGSTOP) or
    hung process still accepts TCP connections in the kernel, but never answers this."""
    import grpc  # gRPC's own client (TensorFlow depends on it)

    channel = grpc.insecure_channel(addr)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


class HungTaskWatchdog:
    """A background thread that checks every `WATCH_EVERY_SECONDS` that each task of `spec`
    still answers a gRPC handshake within `hung_seconds` (`$ENSEMBLE_HUNG_SECONDS`, default
    `HUNG_SECONDS`). When one does not, the call waiting on it in TensorFlow's runtime would
    wait for ever (its gRPC calls have no deadline), so the watchdog prints one line naming
    the task on stderr and ends the process with status 1; its newest checkpoint stays the
    resume point. Detection takes at most `WATCH_EVERY_SECONDS + hung_seconds`.
    """

    def __init__(self, spec: dict, hung_seconds: float | None = None):
        self.spec = spec
        self.hung_seconds = hung_seconds or float(os.environ.get("ENSEMBLE_HUNG_SECONDS",
                                                                 HUNG_SECONDS))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="hung-task-watchdog",
                                        daemon=True)

    def __enter__(self) -> "HungTaskWatchdog":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(WATCH_EVERY_SECONDS):
            for job, i, addr in tasks(self.spec):
                if self._stop.is_set():
                    return
                if not answers(addr, self.hung_seconds) and not self._stop.is_set():
                    print(f"error: cluster task {job}:{i} ({addr}) stopped answering: no "
                          f"gRPC handshake in {self.hung_seconds:.0f} s (stopped or hung); "
                          "the newest checkpoint is kept: restart the task, then resume",
                          file=sys.stderr, flush=True)
                    os._exit(1)


@contextmanager
def naming_unreachable_tasks(spec: dict | None):
    """Run a block on the cluster `spec` (None: locally, nothing changes). An error raised in
    it while a task is unreachable becomes a ClusterError naming those tasks; other errors
    pass unchanged. A task that stops answering meanwhile ends the process
    (`HungTaskWatchdog`)."""
    try:
        if spec is None:
            yield
        else:
            with HungTaskWatchdog(spec):
                yield
    except ClusterError:
        raise
    except Exception:
        down = unreachable(spec, timeout=2.0) if spec is not None else []
        if not down:
            raise
        raise ClusterError(f"cluster task unreachable during the run: {', '.join(down)}") \
            from None


def public_addresses(spec: dict[str, list[str]]) -> list[str]:
    """Addresses of the spec outside the loopback and private ranges."""
    out = []
    for _, _, addr in tasks(spec):
        host = addr.rpartition(":")[0].strip("[]")
        try:
            ip = ipaddress.ip_address(host if host != "localhost" else "127.0.0.1")
        except ValueError:
            try:
                ip = ipaddress.ip_address(socket.gethostbyname(host))
            except OSError:
                out.append(addr)
                continue
        if not (ip.is_loopback or ip.is_private):
            out.append(addr)
    return out


def split_address(addr: str) -> tuple[str, int]:
    """`host:port` (or `[v6]:port`) of a cluster spec as `(host, port)`.

    Raises:
        UsageError: no port, or a port outside 1-65535 (names the address).
    """
    host, _, port = str(addr).rpartition(":")
    if not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        raise UsageError(f"Expected the cluster spec's address to be host:port with a port in "
                         f"1-65535. Received: {addr!r}")
    return host.strip("[]"), int(port)


def check_port_free(addr: str) -> None:
    """Refuse a port another process listens on, before TensorFlow tries it (its error is a
    traceback). TensorFlow's server listens on every interface, so the port is tried there.

    Raises:
        UsageError: the port is in use (names it).
    """
    _, port = split_address(addr)
    for family, any_host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            probe = socket.socket(family, socket.SOCK_STREAM)
        except OSError:
            continue
        try:  # SO_REUSEADDR as gRPC sets it: connections of a server that just stopped
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # (TIME_WAIT) pass,
            probe.bind((any_host, port))  # a listening socket does not
            return
        except OSError as exc:
            if family == socket.AF_INET6 and exc.errno not in (98,):  # no IPv6: try IPv4
                continue
            raise UsageError(f"Cannot serve at {addr}: port {port} is in use by another "
                             "process (stop it, or give this task another port in the "
                             "cluster spec)") from None
        finally:
            probe.close()


def exposure_warning(addr: str) -> str | None:
    """The warning for a task whose spec address is narrower than what TensorFlow binds:
    `tf.distribute.Server` always listens on every interface (`[::]:port`), so a task the spec
    puts on the loopback or one address is reachable from the network too; None when the spec
    already names every interface."""
    host, port = split_address(addr)
    if host in ("0.0.0.0", "::", ""):
        return None
    return (f"WARNING: TensorFlow's gRPC server cannot bind one address: it listens on every "
            f"interface at port {port}, not only on {host} as the cluster spec names. It has "
            "no authentication and runs any graph it is sent: block port "
            f"{port} from other hosts (a firewall) or serve only on an isolated network.")


def serve(spec: dict[str, list[str]], task: str) -> int:
    """Start the `tf.distribute.Server` of `task` (`job:index`) and serve until SIGTERM or
    SIGINT; returns exit status 0.

    Its address is checked first: a port outside 1-65535 or in use is refused in one line;
    the exposure of TensorFlow's bind to every interface is warned about on stderr.

    Raises:
        UsageError: a task that is not in the spec, a bad or busy port.
    """
    job, _, index = task.partition(":")
    if job not in spec or not index.isdigit() or int(index) >= len(spec[job]):
        raise UsageError(f"Expected --task JOB:I from {[f'{j}:{i}' for j, i, _ in tasks(spec)]}. "
                         f"Received: task={task!r}")
    addr = spec[job][int(index)]
    check_port_free(addr)
    public = public_addresses(spec)
    if public:
        print(f"WARNING: {', '.join(public)} are outside the loopback and private ranges. "
              "TensorFlow servers have no authentication and run any graph they are sent: "
              "serve only on an isolated network.", file=sys.stderr, flush=True)
    elif exposure_warning(addr):
        print(exposure_warning(addr), file=sys.stderr, flush=True)
    from ensemble.core.tfimport import import_tensorflow_quietly

    import_tensorflow_quietly()
    import tensorflow as tf

    tf.config.experimental.enable_op_determinism()
    try:
        server = tf.distribute.Server(tf.train.ClusterSpec(spec), job_name=job,
                                      task_index=int(index), protocol="grpc", start=True)
    except tf.errors.OpError as exc:  # a port taken between the check and the bind
        raise UsageError(f"Cannot serve {task} at {addr}: "
                         f"{' '.join(str(exc.message).split())[:200]}") from None
    devices = [d.name for d in tf.config.list_logical_devices()]
    print(f"serving {task} at {spec[job][int(index)]} ({server.target}); devices: "
          f"{', '.join(devices)}", flush=True)
    stop = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.append(True))
    while not stop:
        time.sleep(0.2)
    print(f"stopping {task}", flush=True)
    sys.stdout.flush()
    os._exit(0)  # the gRPC server has no clean shutdown; exit without waiting for it
