"""What `ensemble devices` prints: the physical and logical devices TensorFlow sees, with
their memory, and the TensorFlow build (`describe`, `format_description`).

Reading the devices initialises TensorFlow's runtime: set up the devices first
(`ensemble.replication.devices`: `configure_gpus`, `split_cpu`, `resolve`).
"""

from __future__ import annotations

import os

from ensemble.replication.devices import build_info, canonical


def _host_memory_bytes() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def describe() -> dict:
    """The physical and logical devices TensorFlow sees, with their memory in bytes.

    Returns:
        `{"physical": [{name, type, memory_bytes, details}], "logical": [{name, type,
        memory_limit_bytes}], "build": build_info()}`: the physical CPU's memory is the host's
        RAM; a physical GPU's is its total memory as TensorFlow reports it
        (`device_lib.list_local_devices`, the memory of the logical devices on it, when
        no limit is set); a logical GPU's is TensorFlow's memory limit for it; None for the
        logical CPUs, which share the host memory (the 256 MiB `device_lib` reports for
        `CPU:0` is a nominal figure, not a cap).
    """
    import tensorflow as tf
    from tensorflow.python.client import device_lib

    local = {canonical(d.name): int(d.memory_limit) for d in device_lib.list_local_devices()}
    physical = []
    for dev in tf.config.list_physical_devices():
        details = {}
        if dev.device_type == "GPU":
            try:
                details = {k: (v if isinstance(v, (str, int)) else str(v))
                           for k, v in tf.config.experimental.get_device_details(dev).items()}
            except Exception:
                details = {}
        mem = (_host_memory_bytes() if dev.device_type == "CPU" else
               sum(v for k, v in local.items() if f"{dev.device_type}:" in k) or None)
        physical.append({"name": dev.name, "type": dev.device_type, "memory_bytes": mem,
                         "details": details})
    logical = [{"name": canonical(d.name), "type": d.device_type,
                "memory_limit_bytes": (None if d.device_type == "CPU"
                                       else local.get(canonical(d.name)))}
               for d in tf.config.list_logical_devices()]
    return {"physical": physical, "logical": logical, "build": build_info()}


def _size(n: int | None) -> str:
    if n is None:
        return "memory unknown"
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n} B"
        n /= 1024
    return ""


def format_description(desc: dict) -> str:
    """`describe()` as the lines `ensemble devices` prints."""
    lines = ["physical devices:"]
    for d in desc["physical"]:
        extra = d["details"].get("device_name")
        cc = d["details"].get("compute_capability")
        what = f" ({extra}{f', compute capability {cc}' if cc else ''})" if extra else ""
        label = "host memory" if d["type"] == "CPU" else "memory"
        lines.append(f"  {d['name']:<28} {d['type']:<4} {label} {_size(d['memory_bytes'])}{what}")
    if not any(d["type"] == "GPU" for d in desc["physical"]):
        lines.append("  (no GPU visible to TensorFlow)")
    lines.append("logical devices:")
    for d in desc["logical"]:
        mem = d["memory_limit_bytes"]
        text = ("shares host memory" if d["type"] == "CPU" else f"memory limit {_size(mem)}")
        lines.append(f"  {d['name']:<28} {d['type']:<4} {text}")
    b = desc["build"]
    if b.get("is_cuda_build"):
        gpu = f"CUDA {b.get('cuda_version', '?')}, cuDNN {b.get('cudnn_version', '?')}"
    else:
        gpu = "no CUDA (CPU-only build)"
    lines.append(f"tensorflow {b['tensorflow']}: {gpu}")
    return "\n".join(lines)
