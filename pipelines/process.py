"""The `ensemble` process around `pipelines.cli.main`, for both ways in (the console script
`pipelines.console:entry` and `python -m pipelines.cli`): the one place that prints the line
of a Ctrl-C that comes before `main` handles signals (while the CLI's modules load or its
streams are set up): `interrupted (SIGINT)` and exit status 130, no traceback, as every later
one (`main` prints its own, naming where a run stopped, and returns its status).
"""

from __future__ import annotations

import signal
import sys

TYPE_CHECKING = False  # `typing` (with functools, collections, re) is not imported at run time:
if TYPE_CHECKING:  # the fewer modules before `run`'s guard, the smaller the window a Ctrl-C
    from typing import Callable  # can land in with a traceback (the console script's import)


def run(load_main: Callable[[], Callable[[], int]]) -> None:
    """Load `main` (`load_main()`, inside the Ctrl-C guard), run it, exit with its status.

    Raises:
        SystemExit: always: `main()`'s status, or 130 after a Ctrl-C before it handled
            signals (a second Ctrl-C then is ignored: one line, no traceback). Once the
            status is decided, SIGINT is ignored while the process exits.
    """
    try:
        from ensemble.core.tfimport import own_process

        own_process()  # this process's TensorFlow objects are frozen once imported
        main = load_main()
        from pipelines.pipe import guard_std_streams

        guard_std_streams()  # `ensemble train | head -3` completes the run (pipelines.pipe)
        status = main()
    except KeyboardInterrupt:  # `main`'s own Interrupted never gets here
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # we are exiting: no second line
        print("interrupted (SIGINT)", file=sys.stderr, flush=True)
        status = 130
    # the command's work is done and its status decided: a Ctrl-C during the interpreter's
    # teardown (TensorFlow's takes seconds; Python restores the default action there) would
    # kill the process silently with status 130 after a run that completed
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from ensemble.core.memory import skip_final_collection

    skip_final_collection()
    sys.exit(status)

