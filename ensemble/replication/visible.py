"""The devices a between-graph client process sees: the run's device names mapped to the client's.

A client is started with only its own devices visible (`CUDA_VISIBLE_DEVICES` for GPUs, the
whole CPU, or its CPU split into the logical devices its replicas need), so a run's
`/GPU:3` may be the client's `/device:GPU:0`.
"""
from __future__ import annotations

import os
from typing import Sequence

from ensemble.core.errors import UsageError
from ensemble.replication.placement import is_remote


def local_devices(devices: Sequence[str], visible: str | None = None
                  ) -> tuple[dict[str, str], list[str]]:
    """Map the run's device names of a client's members to what the client process sees.

    A client sees only its own devices: for GPUs it sets `CUDA_VISIBLE_DEVICES` to theirs (in
    order of first use) and names them `/device:GPU:0..`; a (logical) CPU device is the
    client's whole `/device:CPU:0`; a cluster device stays as it is. GPU `k` of the run is the
    `k`-th GPU this process may use: the `k`-th entry of the parent's `CUDA_VISIBLE_DEVICES`
    (`visible`, default the environment's) when set, as under Slurm or Kubernetes
    (`CUDA_VISIBLE_DEVICES=2,3`: run GPU 1 is physical GPU 3), else physical GPU `k`.

    Returns:
        (environment variables to set before TensorFlow starts, `[len(devices)]` device names
        in the client).

    Raises:
        UsageError: a run GPU beyond the parent's visible GPUs (names both).
    """
    visible = os.environ.get("CUDA_VISIBLE_DEVICES") if visible is None else visible
    parent = None if visible is None else [v.strip() for v in visible.split(",") if v.strip()]
    gpus: list[str] = []
    names = []
    for device in devices:
        if is_remote(device):
            names.append(device)
            continue
        kind, _, index = device.rpartition("device:")[2].partition(":")
        if kind == "GPU":
            if parent is not None:
                if not index.isdigit() or int(index) >= len(parent):
                    raise UsageError(f"Device {device} of the run is not visible here: "
                                     f"CUDA_VISIBLE_DEVICES={visible!r} shows {len(parent)} "
                                     "GPU(s).")
                index = parent[int(index)]
            if index not in gpus:
                gpus.append(index)
            names.append(f"/device:GPU:{gpus.index(index)}")
        else:
            names.append("/device:CPU:0")
    return ({"CUDA_VISIBLE_DEVICES": ",".join(gpus)} if gpus else {}), names


def local_replica_devices(groups: Sequence[Sequence[str]], visible: str | None = None
                          ) -> tuple[dict[str, str], list[list[str]], int]:
    """`local_devices` for a client whose members have several replicas each (data
    parallelism): GPUs as `local_devices` maps them; the distinct (logical) CPU devices, in
    order of first use, become this client's `/device:CPU:0..k-1`, so the client must split
    its CPU into `k` logical devices (`devices.split_cpu`) before TensorFlow initialises;
    cluster devices stay as they are.

    Args:
        groups: `[n_members]` lists of the run's replica device names (replica 0 first).

    Returns:
        (environment variables, `[n_members]` lists of device names in the client, `k`: the
        logical CPU devices the client needs, 0 for none).
    """
    flat = [d for g in groups for d in g]
    env, names = local_devices(flat, visible)
    cpus = list(dict.fromkeys(d for d, n in zip(flat, names) if n == "/device:CPU:0"))
    names = [f"/device:CPU:{cpus.index(d)}" if n == "/device:CPU:0" else n
             for d, n in zip(flat, names)]
    out, at = [], 0
    for g in groups:
        out.append(names[at:at + len(g)])
        at += len(g)
    return env, out, len(cpus)
