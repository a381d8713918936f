"""Pipelines: train, predict, evaluate, aggregate, compare, benchmark; the CLI lives here.

`entry` is the `ensemble` console script (pyproject.toml) and `python -m pipelines.cli`: it
loads `pipelines.cli` itself, so that a Ctrl-C landing while the CLI's modules load (before the
CLI handles signals) ends as every later one does: one line and exit status 130, no traceback.
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
