"""Device specs: resolve `auto`, `cpu:N` or a list of device names to TensorFlow devices.

`cpu:N` splits the CPU into N logical devices, which TensorFlow allows only before it
initialises its runtime; call `resolve` before running any TensorFlow op.
"""

from __future__ import annotations

import os

from ensemble.errors import UsageError

AUTO_CPU_CAP = 8  # logical CPU devices share the cores: more than this only adds overhead


def parse(spec: str) -> tuple[str, int | list[str]]:
    """Parse a device spec: `("auto", 0)`, `("cpu", N)` or `("list", [names])`.

    Raises:
        UsageError: malformed spec.
    """
    spec = spec.strip()
    if spec == "auto":
        return "auto", 0
    if spec.startswith("cpu:"):
        n = spec[4:]
        if not n.isdigit() or int(n) < 1:
            raise UsageError(f"Expected `--devices cpu:N` with N >= 1. Received: devices={spec!r}")
        return "cpu", int(n)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names or not all(s.startswith("/") for s in names):
        raise UsageError(
            "Expected `--devices` to be auto, cpu:N or device names such as /GPU:0,/GPU:1. "
            f"Received: devices={spec!r}"
        )
    return "list", names


def canonical(name: str) -> str:
    """`/GPU:0` -> `/device:GPU:0`; keeps the job/replica/task of a cluster device.

    Raises:
        UsageError: not a device name.
    """
    import tensorflow as tf

    try:
        spec = tf.DeviceSpec.from_string(name)
    except ValueError:
        raise UsageError(f"Expected a device name such as /GPU:0. Received: {name!r}") from None
    if spec.device_type is None:
        raise UsageError(f"Expected a device name such as /GPU:0. Received: {name!r}")
    return spec.replace(device_index=spec.device_index or 0).to_string()


def split_cpu(n: int) -> list[str]:
    """Split the CPU into `n` logical devices (or reuse an earlier, large enough split).

    Raises:
        UsageError: TensorFlow is already initialised with fewer logical CPU devices.
    """
    import tensorflow as tf

    cpu = tf.config.list_physical_devices("CPU")[0]
    if len(tf.config.get_logical_device_configuration(cpu) or []) >= n:
        return [f"/device:CPU:{i}" for i in range(n)]  # an earlier, larger split stands
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)]
        )
    except RuntimeError:  # already initialised in this process
        have = len(tf.config.list_logical_devices("CPU"))
        if have < n:
            raise UsageError(
                f"TensorFlow is already initialised with {have} logical CPU devices; "
                f"cannot split into cpu:{n}"
            ) from None
    return [f"/device:CPU:{i}" for i in range(n)]


def set_threads(intra_op: int | None = None, inter_op: int | None = None) -> None:
    """Set TensorFlow's thread pools (before initialisation; ignored afterwards)."""
    import tensorflow as tf

    try:
        if intra_op:
            tf.config.threading.set_intra_op_parallelism_threads(intra_op)
        if inter_op:
            tf.config.threading.set_inter_op_parallelism_threads(inter_op)
    except RuntimeError:
        pass


def resolve(spec: str, n_members: int, cluster: dict | None = None) -> list[str]:
    """Resolve a device spec to canonical device names, configuring logical CPUs if needed.

    `auto`: every GPU if there is one, otherwise the CPU split into
    `min(n_members, AUTO_CPU_CAP)` logical devices. With a `cluster` spec, this client
    connects to it first and `auto` means the devices of its tasks (`cluster.connect`).

    Raises:
        UsageError: malformed spec, or a named device this machine (or cluster) does not have.
        cluster.ClusterError: a task of the cluster is unreachable.
    """
    import tensorflow as tf

    kind, value = parse(spec)
    if cluster is not None:
        from ensemble.cluster import connect

        if kind == "cpu":
            raise UsageError(f"--devices {spec} splits the local CPU; with --cluster use auto "
                             "or device names such as /job:worker/replica:0/task:1/device:CPU:0")
        remote = connect(cluster)
        if kind == "auto":
            return remote
    if kind == "cpu":
        return split_cpu(value)
    if kind == "auto":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            return [f"/device:GPU:{i}" for i in range(len(gpus))]
        return split_cpu(max(1, min(n_members, AUTO_CPU_CAP)))
    names = [canonical(n) for n in value]
    local = {canonical(d.name) for d in tf.config.list_logical_devices()}
    for name in names:
        if "/job:" not in name and name not in local:
            raise UsageError(
                f"Unknown device {name!r}; this machine has: {', '.join(sorted(local))}"
            )
    return names


def cpu_count() -> int:
    """Cores this process may use."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def peak_rss_bytes() -> int:
    """This process's peak resident memory in bytes (`VmHWM` of /proc/self/status, which,
    unlike `ru_maxrss`, does not inherit the parent's memory at fork)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
