"""Devices you can see and control: GPU memory settings on a machine without GPUs (a notice,
not a crash), `ensemble devices` on a CPU split into logical devices, the TensorFlow build in
the manifest, and `--log-device-placement` filtered to the members."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from conftest import ROOT, N_LOGICAL_CPUS, run_cli
from ensemble.core import artifacts
from ensemble.config import schema
from ensemble.replication import devices
from ensemble.replication import placement_log
from ensemble.core.errors import UsageError


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def test_memory_settings_without_gpu_give_a_notice_not_a_crash(tmp_path):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    notices = devices.configure_gpus(memory_growth=True, memory_limit_mb=512)
    assert len(notices) == 1 and "no GPU" in notices[0] and "memory_limit_mb = 512" in notices[0]
    assert devices.configure_gpus(memory_growth=True, memory_limit_mb=0) == []


def test_train_with_memory_limit_on_cpu_prints_notice_and_trains(tmp_path, tiny_config, capfd):
    if _has_gpu():
        pytest.skip("this machine has a GPU")
    cfg = tmp_path / "mem.toml"
    cfg.write_text(tiny_config.read_text().replace(
        'devices = "cpu:2"', 'devices = "cpu:2"\nmemory_growth = true\nmemory_limit_mb = 256'))
    run_dir = tmp_path / "run"
    assert run_cli("train", "--config", cfg, "--members", 1, "--epochs", 1,
                   "--run-dir", run_dir, "--quiet") == 0
    err = capfd.readouterr().err
    assert "notice: no GPU on this machine: placement.memory_limit_mb = 256" in err
    manifest = artifacts.read_manifest(run_dir)
    assert manifest["status"] == "completed"
    assert manifest["config"]["placement"]["memory_limit_mb"] == 256
    import tensorflow as tf

    build = manifest["tensorflow_build"]
    assert build["tensorflow"] == tf.__version__
    assert build.get("cuda_version") == tf.sysconfig.get_build_info().get("cuda_version")


def test_negative_memory_limit_is_a_usage_error():
    with pytest.raises(UsageError, match="memory_limit_mb"):
        schema.from_dict({"placement": {"memory_limit_mb": -1}})


def test_devices_lists_the_logical_cpus_in_process(capsys):
    assert run_cli("devices") == 0
    out = capsys.readouterr().out
    assert "physical devices:" in out and "/physical_device:CPU:0" in out
    logical = [ln.split() for ln in out.splitlines() if ln.strip().startswith("/device:CPU:")]
    assert [ln[0] for ln in logical] == [f"/device:CPU:{i}" for i in range(N_LOGICAL_CPUS)]
    # no logical CPU shows a "memory limit" (TensorFlow's 256 MiB for CPU:0 is nominal)
    assert all(ln[2:] == ["shares", "host", "memory"] for ln in logical), logical
    assert f"/device:CPU:{N_LOGICAL_CPUS}" not in out
    assert "host memory" in out and "GiB" in out
    assert "tensorflow " in out


def test_devices_command_splits_the_cpu_in_a_fresh_process():
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "devices", "--devices", "cpu:3",
                          "--memory-limit-mb", "128"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    logical = [ln for ln in out.stdout.splitlines() if ln.strip().startswith("/device:CPU:")]
    assert [ln.split()[0] for ln in logical] == [f"/device:CPU:{i}" for i in range(3)]
    assert "notice: no GPU on this machine" in out.stderr


def test_devices_without_options_shows_the_devices_train_would_use_with_auto():
    """On 2 cores (the process pinned to two), `ensemble devices` for the default 4 members
    shows and splits CPU:0 and CPU:1: one device per core, not per member (the expectation
    is written out, not taken from `auto_cpu_devices`)."""
    if len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs 2 cores")
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    pin = sorted(os.sched_getaffinity(0))[:2]
    out = subprocess.run([sys.executable, "-m", "pipelines.cli", "devices"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120,
                         preexec_fn=lambda: os.sched_setaffinity(0, pin))
    assert out.returncode == 0, out.stderr
    logical = [ln.split()[0] for ln in out.stdout.splitlines()
               if ln.strip().startswith("/device:CPU:")]
    assert logical == ["/device:CPU:0", "/device:CPU:1"]
    assert out.stdout.splitlines()[-1] == (
        "--devices auto (for the config's 4 members) uses: /device:CPU:0, /device:CPU:1")


@pytest.mark.parametrize("cores, members, expected", [
    (2, 4, 2),    # this machine: one device per core, members interleave on them
    (16, 4, 4),   # one per member when cores are plenty
    (16, 12, 8),  # at most 8 (AUTO_CPU_CAP): more only adds executor work
    (1, 4, 1), (4, 1, 1), (4, 0, 1)])  # never fewer than one
def test_auto_without_a_gpu_is_one_cpu_device_per_member_up_to_the_cores_and_8(
        monkeypatch, cores, members, expected):
    monkeypatch.setattr(devices, "cpu_count", lambda: cores)
    monkeypatch.setattr(devices, "gpu_possible", lambda: False)
    assert devices.resolve("auto", members, names_only=True) == [
        f"/device:CPU:{i}" for i in range(expected)]


def test_auto_with_gpus_is_every_gpu_whatever_the_members_and_cores(monkeypatch):
    import tensorflow as tf

    gpus = [tf.config.PhysicalDevice(f"/physical_device:GPU:{i}", "GPU") for i in range(3)]
    real = tf.config.list_physical_devices
    monkeypatch.setattr(tf.config, "list_physical_devices",
                        lambda kind=None: gpus if kind == "GPU" else real(kind))
    monkeypatch.setattr(devices, "cpu_count", lambda: 2)
    for members in (1, 5):
        assert devices.resolve("auto", members) == [
            "/device:GPU:0", "/device:GPU:1", "/device:GPU:2"]


def test_log_device_placement_names_each_members_device(tmp_path, tiny_config):
    # a fresh process: TensorFlow logs placement only when asked before its runtime starts
    run_dir = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=str(ROOT), CUDA_VISIBLE_DEVICES="")
    res = subprocess.run([sys.executable, "-m", "pipelines.cli", "train", "--config", tiny_config,
                          "--members", "2", "--epochs", "1", "--run-dir", run_dir,
                          "--log-device-placement", "--quiet"], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    manifest = artifacts.read_manifest(run_dir)
    assert [m["device"] for m in manifest["members"]] == ["/device:CPU:0", "/device:CPU:1"]
    lines = res.stdout.splitlines()
    for m in manifest["members"]:
        line = next(ln for ln in lines if ln.startswith(f"member {m['index']}: "))
        # every op of the member ran on its own placed device, none elsewhere
        assert line.count(" ops on ") == 1
        assert line.endswith(f" ops on /job:localhost/replica:0/task:0{m['device']}")
        assert int(line.split()[2]) > 10
    log = (run_dir / "placement" / "in-graph.log").read_text().splitlines()
    assert log and all("member_" in ln for ln in log)
    assert not any(placement_log.LINE.match(ln) for ln in lines)  # the raw log is filtered out


def test_placement_log_in_a_started_runtime_is_a_notice(tmp_path, capfd):
    import tensorflow as tf

    from ensemble.replication import placement_log

    tf.constant(1.0) + 1  # the runtime has started in this test process
    with placement_log.capture(tmp_path / "p.log"):
        pass
    assert "notice: TensorFlow already started" in capfd.readouterr().err
