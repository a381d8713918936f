"""The `ensemble` console script (pyproject.toml): loads the CLI inside `pipelines.process.run`,
so that a Ctrl-C while the CLI's modules load ends as every later one does: one line and exit
status 130, no traceback. (`python -m pipelines.cli` runs `pipelines.process.run` once its
module has loaded.)
"""

from pipelines.process import run


def _main():
    from pipelines.cli import main

    return main


def entry() -> None:
    """Run the `ensemble` command (`pipelines.cli.main`) and exit with its status
    (`pipelines.process.run`)."""
    run(_main)
