"""The `ensemble` console script (pyproject.toml): loads the CLI itself, so that a Ctrl-C while
the CLI's modules load (before it handles signals) ends as every later one does: one line and
exit status 130, no traceback. (`python -m pipelines.cli` runs `pipelines.cli.entry` once its
module has loaded.)
"""

import sys


def entry() -> None:
    """Run the `ensemble` command (`pipelines.cli.entry`) and exit with its status."""
    try:
        from pipelines import cli
    except KeyboardInterrupt:
        print("interrupted (SIGINT)", file=sys.stderr, flush=True)
        sys.exit(130)
    cli.entry()
