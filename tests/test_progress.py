"""Progress reporting: `ensemble train` with stdout to a pipe shows per-epoch lines while the
run is still going, in both modes (the run is held at the end of epoch 1 by the test hook)."""

import subprocess
import threading
import time

import pytest
from conftest import run_cli, start_held

from ensemble.replication import progress, protocol


def _lines_while_held(argv, tmp_path, want, member=None, timeout=180):
    """Start `ensemble train ARGV` with stdout to a pipe, held after the first epoch's
    checkpoint; read stdout until a line starts with `want`; return (the lines read while it was
    held, exit status, rest of stdout)."""
    proc, marker = start_held(["train", *argv], tmp_path, "0:end", member,
                              stdout=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while not marker.exists():
            assert proc.poll() is None, proc.stderr.read()
            assert time.monotonic() < deadline, "the run never reached the hold point"
            time.sleep(0.1)
        seen = []
        while not any(line.startswith(want) for line in seen):  # blocks until a line comes
            line = proc.stdout.readline()
            assert line, "stdout closed before an epoch line"
            seen.append(line)
        assert proc.poll() is None  # the run is still held: the lines came before its end
        marker.unlink()
        # the rest through the same reader: `communicate` reads the pipe itself and would miss
        # lines that `readline` already took into the reader's buffer with the last one;
        # stderr is drained beside it, so that a full stderr pipe cannot hold the run
        drain = threading.Thread(target=proc.stderr.read, daemon=True)
        drain.start()
        rest = proc.stdout.read()
        proc.wait(timeout=timeout)
        drain.join(timeout=timeout)
        return seen, proc.returncode, rest
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_in_graph_progress_reaches_a_pipe_before_the_run_ends(tiny_config, tmp_path):
    seen, code, rest = _lines_while_held(["--config", tiny_config, "--run-dir",
                                          tmp_path / "run"], tmp_path, "epoch 1/2: loss")
    assert code == 0
    # the first line: batch size and early stopping, the automatic one marked (issue 40)
    assert seen[0].startswith("training 4 members for up to 2 epochs: batch size 64, early "
                              "stopping after 5 epochs without a better validation loss, best "
                              "epoch kept (auto)"), seen[0]
    line = next(x for x in seen if x.startswith("epoch 1/2: loss"))  # not a step line
    assert "loss" in line and "val_loss" in line and "val_accuracy" in line
    assert "epoch 2/2" in rest and "run directory" in rest
    assert protocol.PREFIX not in "".join(seen) + rest  # no machine reports on stdout


def test_between_graph_progress_is_one_line_per_member_and_epoch(tiny_config, tmp_path):
    seen, code, rest = _lines_while_held(["--config", tiny_config, "--run-dir", tmp_path / "run",
                                          "--mode", "between-graph", "--jobs", "2"],
                                         tmp_path, "member 0: epoch 1/2", member=0)
    assert code == 0
    assert seen[0].startswith("training 4 members for up to 2 epochs: batch size 64, early "), seen
    assert any(x.startswith("member 0: epoch 1/2 - loss") for x in seen)
    out = "".join(seen) + rest
    for i in range(4):
        for e in (1, 2):
            lines = out.splitlines()
            assert sum(x.startswith(f"member {i}: epoch {e}/2 -") for x in lines) == 1, out
    assert protocol.PREFIX not in out


def test_quiet_prints_no_progress(tiny_config, tmp_path, capfd):
    """No progress line on stdout, only the run's folder; stdout is captured at its file
    descriptor, not a terminal: the case where the tests above read epoch lines."""
    assert run_cli("train", "--config", tiny_config, "--run-dir", tmp_path / "run", "--quiet",
                   "--members", "2", "--epochs", "1") == 0
    out = capfd.readouterr().out
    assert "epoch" not in out and "run directory" in out


@pytest.mark.parametrize("tty", [False, True])
def test_progress_for_people_picks_bar_or_log_lines(tty):
    class Stream:
        def isatty(self):
            return tty

    kinds = [type(c) for c in progress.for_people(1, Stream())]
    assert kinds == [progress.TerminalProgress if tty else progress.LogProgress]
    assert progress.for_people(0, Stream()) == []


def test_a_resume_whose_checkpoint_holds_every_epoch_says_so(capsys):
    """Stopped after its last epoch's checkpoint (while saving or predicting): no epoch is
    left to train, and neither mode says it resumes at epoch N + 1 of N."""
    progress.ResumeNotice().on_train_begin(3, 3, 10)
    assert capsys.readouterr().err.strip() == (
        "every epoch trained (the checkpoint of epoch 3); resuming after training")
    assert progress.format_report(protocol.Resume(0, 3, 3)) == (
        "member 0: every epoch trained (the checkpoint of epoch 3); resuming after training")
    assert progress.format_report(protocol.Resume(1, 2, 3)) == (
        "member 1: resuming at epoch 3 of 3 from the checkpoint of epoch 2")
