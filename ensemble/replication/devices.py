"""Devices: resolve `auto`, `cpu:N` or a list of device names to TensorFlow devices, set GPU
memory growth and limits, and name the TensorFlow build (`ensemble.replication.device_report`
describes the devices for `ensemble devices`).

`cpu:N` splits the CPU into N logical devices and `configure_gpus` sets memory growth or a
memory limit (a logical device configuration, as in TensorFlow's GPU guide); TensorFlow allows
both only before it initialises its runtime, so call them before running any TensorFlow op.
"""

from __future__ import annotations

import os

from ensemble.core.errors import UsageError
from ensemble.models.precision import use_system_allocator

AUTO_CPU_CAP = 8  # logical CPU devices share the cores: more than this only adds overhead


def auto_cpu_devices(n_members: int) -> int:
    """Logical CPU devices of `--devices auto` without a GPU: one per member, at most one per
    core this process may use (`cpu_count`) and at most `AUTO_CPU_CAP`. More devices than
    cores only interleave members on the same cores, and each device adds executor work per
    step (4 members on 2 cores: 1.5x the steps per second on 2 devices as on 4)."""
    return max(1, min(n_members, cpu_count(), AUTO_CPU_CAP))


def parse(spec: str, flag: str = "--devices") -> tuple[str, int | list[str]]:
    """Parse a device spec: `("auto", 0)`, `("cpu", N)` or `("list", [names])`; errors name
    the spec as `flag` (the estimators' parameter is `devices`).

    Raises:
        UsageError: malformed spec.
    """
    spec = spec.strip()
    if spec == "auto":
        return "auto", 0
    if spec.startswith("cpu:"):
        n = spec[4:]
        if not n.isdigit() or int(n) < 1:
            form = f"{flag} cpu:N" if flag.startswith("--") else f"{flag}='cpu:N'"
            raise UsageError(f"Expected `{form}` with N >= 1. Received: devices={spec!r}")
        return "cpu", int(n)
    names = [s.strip() for s in spec.split(",") if s.strip()]
    if not names or not all(s.startswith("/") for s in names):
        raise UsageError(
            f"Expected `{flag}` to be auto, cpu:N or device names such as /GPU:0,/GPU:1. "
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


def split_cpu(n: int, allow_fewer: bool = False) -> list[str]:
    """Split the CPU into `n` logical devices (or reuse an earlier, large enough split).

    Args:
        allow_fewer: when TensorFlow is already initialised with fewer logical CPU devices,
            return those (members then share them round robin) instead of raising.

    Raises:
        UsageError: TensorFlow is already initialised with fewer logical CPU devices (and
            not `allow_fewer`).
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
        if have < n and allow_fewer:
            return [f"/device:CPU:{i}" for i in range(have)]
        if have < n:
            raise UsageError(
                f"TensorFlow is already initialised with {have} logical CPU devices; "
                f"cannot split into cpu:{n} (expected at most cpu:{have} in this process; "
                f"cpu:{n} needs a new one, e.g. a restarted notebook kernel)"
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


GPU_DEVICE_NODES = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/kfd", "/dev/dxg")


def gpu_possible() -> bool:
    """Whether TensorFlow could find a GPU here: a CUDA (`/dev/nvidia*`), ROCm (`/dev/kfd`) or
    WSL (`/dev/dxg`) device node exists, or the OS is not Linux (Metal plug-ins). A cheap
    check, so that a process that only *names* devices (the between-graph launcher) can skip
    importing TensorFlow on a machine without GPUs."""
    import sys

    return not sys.platform.startswith("linux") or any(os.path.exists(p)
                                                        for p in GPU_DEVICE_NODES)


def resolve(spec: str, n_members: int, cluster: dict | None = None,
            names_only: bool = False) -> list[str]:
    """Resolve a device spec to canonical device names, configuring logical CPUs if needed.

    `auto`: every GPU if there is one, otherwise the CPU split into
    `auto_cpu_devices(n_members)` logical devices (or the logical CPUs that an already
    initialised TensorFlow has, e.g. in a notebook that trained before). With a `cluster` spec, this client
    connects to it first and `auto` means the devices of its tasks (`cluster.connect`).

    `names_only`: the caller only needs the names (a between-graph launcher: each client
    configures its own TensorFlow); then `cpu:N`, and `auto` on a machine without GPUs
    (`gpu_possible`), are answered without importing TensorFlow or splitting the CPU.

    Raises:
        UsageError: malformed spec, or a named device this machine (or cluster) does not have.
        cluster.ClusterError: a task of the cluster is unreachable.
    """
    kind, value = parse(spec)
    if names_only and cluster is None and (kind == "cpu" or
                                           (kind == "auto" and not gpu_possible())):
        n = value if kind == "cpu" else auto_cpu_devices(n_members)
        return [f"/device:CPU:{i}" for i in range(n)]
    import tensorflow as tf

    if cluster is not None:
        from ensemble.replication.cluster import connect

        if kind == "cpu":
            raise UsageError("Expected --devices auto or device names such as "
                             "/job:worker/replica:0/task:1/device:CPU:0 with --cluster. "
                             f"Received: --devices {spec}, which splits the local CPU.")
        remote = connect(cluster)
        if kind == "auto":
            return remote
    if kind == "cpu":
        return split_cpu(value)
    if kind == "auto":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            return [f"/device:GPU:{i}" for i in range(len(gpus))]
        return split_cpu(auto_cpu_devices(n_members), allow_fewer=True)
    names = [canonical(n) for n in value]
    local = {canonical(d.name) for d in tf.config.list_logical_devices()}
    for name in names:
        if "/job:" not in name and name not in local:
            raise UsageError(
                f"Unknown device {name!r}; this machine has: {', '.join(sorted(local))}"
            )
    return names


def _no_gpu_notice(memory_growth: bool, memory_limit_mb: int) -> list[str]:
    if memory_limit_mb:
        return [f"no GPU on this machine: placement.memory_limit_mb = {memory_limit_mb} "
                f"and memory_growth = {str(memory_growth).lower()} have no effect; "
                "training runs on the CPU"]
    return []


_gpus_configured = False


def set_op_threads(intra_op: int) -> list[str]:
    """Run every op of this process on `intra_op` threads (TensorFlow's intra-op pool; 0:
    leave TensorFlow's default, as many as cores). Convolutions and their gradients (oneDNN's
    and Eigen's alike) split their float sums by this count, so members are equal across
    modes, `--jobs` and member counts only when every process uses the same count
    (`training.intra_op_threads`; see docs/concepts/parity.md).

    Returns:
        A notice when TensorFlow is already initialised with another count (a notebook that
        ran TensorFlow before; the setting then applies from the next process), else [].
    """
    if not intra_op:
        return []
    import tensorflow as tf

    try:
        tf.config.threading.set_intra_op_parallelism_threads(intra_op)
    except RuntimeError:
        have = tf.config.threading.get_intra_op_parallelism_threads() or "TensorFlow's default"
        return [f"TensorFlow is already initialised with {have} intra-op threads, not "
                f"training.intra_op_threads = {intra_op}: convolutional members may differ "
                "from the other mode's by float rounding (start a fresh process for parity)"]
    return []


def configure(cfg) -> list[str]:
    """THE TensorFlow set-up of a training or prediction process for a run config `cfg`:
    oneDNN's allocator for a mixed precision (`precision.use_system_allocator`), the threads
    of one op (`set_op_threads(training.intra_op_threads)`, before TensorFlow
    initialises), GPU memory settings (`configure_gpus`, once per process) and, with
    `training.deterministic`, op determinism (both needed for mode parity).

    Returns:
        `configure_gpus`'s notices the first time, and `set_op_threads`'s, else [].
    """
    global _gpus_configured
    use_system_allocator(cfg.training.precision)
    notices = set_op_threads(cfg.training.intra_op_threads)
    if not _gpus_configured:
        notices += configure_gpus(cfg.placement.memory_growth, cfg.placement.memory_limit_mb)
        _gpus_configured = True
    if cfg.training.deterministic:
        import tensorflow as tf

        tf.config.experimental.enable_op_determinism()
    return notices


def configure_gpus(memory_growth: bool = True, memory_limit_mb: int = 0) -> list[str]:
    """Set memory growth, or a memory limit of `memory_limit_mb` MiB, on every visible GPU.

    TensorFlow refuses memory growth on a GPU with a logical device configuration, so a limit
    wins over growth. Call before TensorFlow initialises its runtime.

    Returns:
        Notices for the user (one line each): no GPU to apply the settings to, or TensorFlow
        already initialised (the settings then apply from the next process). Never raises for
        these cases: a CPU-only machine runs the same config.
    """
    if not gpu_possible():  # answered without starting TensorFlow's GPU probing
        return _no_gpu_notice(memory_growth, memory_limit_mb)
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        return _no_gpu_notice(memory_growth, memory_limit_mb)
    notices = []
    for gpu in gpus:
        try:
            if memory_limit_mb:
                tf.config.set_logical_device_configuration(
                    gpu, [tf.config.LogicalDeviceConfiguration(memory_limit=memory_limit_mb)])
            elif memory_growth:
                tf.config.experimental.set_memory_growth(gpu, True)
        except (RuntimeError, ValueError) as exc:
            notices.append(f"GPU memory settings not applied to {gpu.name} ({exc}); "
                           "TensorFlow was already initialised in this process")
            break
    if memory_limit_mb and memory_growth:
        notices.append(f"placement.memory_limit_mb = {memory_limit_mb} caps each GPU; "
                       "memory_growth does not apply to a GPU with a memory limit")
    return notices


def build_info() -> dict:
    """The TensorFlow build: version, CUDA and cuDNN versions when it is a CUDA build
    (`tf.sysconfig.get_build_info()`), and `onednn`, whether oneDNN's kernels are on in this
    process (absent when the build does not say), as JSON-able values."""
    import tensorflow as tf

    info = {"tensorflow": tf.__version__}
    try:
        raw = dict(tf.sysconfig.get_build_info())
    except Exception:  # some builds have no build info module
        raw = {}
    for key, value in raw.items():
        info[key] = value if isinstance(value, (bool, int, float, str)) else str(value)
    try:  # whether oneDNN's kernels run (TensorFlow's choice, or `TF_ENABLE_ONEDNN_OPTS`)
        from tensorflow.python.util import _pywrap_util_port

        info["onednn"] = bool(_pywrap_util_port.IsMklEnabled())
    except (ImportError, AttributeError):  # a build that does not say
        pass
    return info


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
