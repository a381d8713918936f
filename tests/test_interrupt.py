"""Ctrl-C and SIGTERM in-process (`ensemble.core.interrupt`): a signal is an interruption
wherever it lands, never an error of the code it happened to interrupt; and in the `ensemble`
process from the first line of its own code."""

import signal
import subprocess
import sys
import time
import tomllib

import pytest

from conftest import ROOT, cli_env
from ensemble.core import interrupt
from ensemble.models import builders, members

BUILDER = """import signal

def build(input_shape, n_outputs, seed=0):
    signal.raise_signal(signal.SIGINT)  # Ctrl-C while the user's builder runs
"""


def test_ctrl_c_while_a_builder_file_imports_is_an_interruption(tmp_path):
    path = tmp_path / "slow_import.py"
    path.write_text("import signal\nsignal.raise_signal(signal.SIGINT)\n")
    with pytest.raises(interrupt.Interrupted) as exc, interrupt.handling_signals():
        builders.resolve(f"{path}:build")
    assert exc.value.exit_status == 130


def test_sigterm_while_a_builder_runs_is_an_interruption(tmp_path):
    path = tmp_path / "slow_build.py"
    path.write_text(BUILDER.replace("SIGINT", "SIGTERM"))
    with pytest.raises(interrupt.Interrupted) as exc, interrupt.handling_signals():
        members.build_network(f"{path}:build", {}, (4,), 3, seed=1)
    assert exc.value.exit_status == 143


class _Freed:
    """An object whose finalizer a signal lands in, as in TensorFlow's traced functions
    freed when training ends (Python ignores an exception raised in `__del__`)."""

    def __del__(self):
        signal.raise_signal(signal.SIGINT)


def test_a_signal_landing_in_a_finalizer_is_not_lost(capsys):
    import sys

    hook, went_on = sys.unraisablehook, []
    with pytest.raises(interrupt.Interrupted) as exc, interrupt.handling_signals():
        _Freed()  # freed at once, its Interrupted ignored where it was raised
        went_on.append(True)  # the work goes on to a clean end, then the signal is raised
    assert went_on and exc.value.exit_status == 130
    assert "Exception ignored" not in capsys.readouterr().err  # no traceback on stderr
    assert sys.unraisablehook is hook and interrupt.requested() is None


def test_an_interruption_while_the_arguments_are_parsed_is_one_line():
    from pipelines.guide import interrupted_line  # `main` has no arguments yet: None

    assert interrupted_line(interrupt.Interrupted(signal.SIGTERM), None) == "interrupted (SIGTERM)"


def _started() -> str:
    """A program that runs `ensemble` as the console script of pyproject.toml does, printing
    "started" first thing inside the loader its entry point hands to `pipelines.process.run`
    (so inside the Ctrl-C guard: a signal after "started" lands in the CLI's loading, never in
    the test program's own lines)."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, name = scripts["ensemble"].split(":")
    return (f"import sys\nimport {module} as script\nload = script._main\n"
            f"def _main():\n    print('started', flush=True)\n    return load()\n"
            f"script._main = _main\nsys.exit(script.{name}())")


def test_ctrl_c_while_the_cli_loads_is_one_line_and_130():
    # after "started": the CLI loads for ~0.3 s on a quiet machine, then TF; a loaded
    # machine only lengthens that window, so each delay lands in the CLI's loading
    for delay in (0.0, 0.05, 0.1, 0.2):
        proc = subprocess.Popen([sys.executable, "-c", _started(), "devices"], env=cli_env(),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline() == "started\n"
            time.sleep(delay)
            proc.send_signal(signal.SIGINT)
            _, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
            proc.wait()
        assert (proc.returncode, err.splitlines()) == (130, ["interrupted (SIGINT)"]), (delay, err)


def test_one_place_prints_the_early_ctrl_c_line():
    """`pipelines.console` and `pipelines.cli` both printed "interrupted (SIGINT)" (import
    phase, then start-up); now `pipelines.process.run` alone owns it, which both the console
    script and `python -m pipelines.cli` end in."""
    owners = [p.relative_to(ROOT).as_posix() for p in sorted(ROOT.glob("pipelines/*.py"))
              if '"interrupted (SIGINT)"' in p.read_text()]
    assert owners == ["pipelines/process.py"]


def test_ctrl_c_before_main_handles_signals_is_one_line_even_if_pressed_twice(capsys):
    """A Ctrl-C before `main` handles signals: one line, status 130; a second Ctrl-C while
    the process exits is ignored (it raised a traceback out of the handler)."""
    from pipelines import process

    def main():
        raise KeyboardInterrupt

    old = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exc:
            process.run(lambda: main)
        assert exc.value.code == 130
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
    assert capsys.readouterr().err.splitlines() == ["interrupted (SIGINT)"]


def test_a_finished_command_ignores_ctrl_c_while_the_process_exits():
    """Once `main` has returned, its status stands: a Ctrl-C during the interpreter's teardown
    (TensorFlow's takes seconds, under the default action Python restores there) killed the
    process silently with status 130 after a completed run (measured: `ensemble train`, SIGINT
    1-3 s after the last epoch, manifest `completed`, stderr empty, exit 130)."""
    from pipelines import process

    old = signal.getsignal(signal.SIGINT)
    try:
        with pytest.raises(SystemExit) as exc:
            process.run(lambda: lambda: 7)
        assert exc.value.code == 7
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, old)
