"""The aggregator process of a between-graph run: `python -m ensemble.runs.aggregator RUN`
(`ensemble aggregate --run RUN` is the same step started by hand, with its options).

The launcher (`ensemble.runs.between`) starts it once every client is done, so that its memory
is its own and measured (`protocol.Report`: `peak_rss_bytes`); it combines the members'
prediction files (`ensemble.runs.aggregate.aggregate_run`), never their models, and loads no
TensorFlow.
"""

from __future__ import annotations

import sys

MODULE = "ensemble.runs.aggregator"


def main(argv: list[str] | None = None) -> int:
    """Aggregate the run named by the one argument; returns the exit status
    (`processes.entry`: 0, 2 bad input, 1 a resource fault)."""
    import argparse
    from pathlib import Path

    from ensemble.replication import processes

    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("run", help="the run directory whose clients are done")
    args = parser.parse_args(argv)

    def body() -> dict:
        from ensemble.replication.devices import peak_rss_bytes
        from ensemble.runs.aggregate import aggregate_run

        aggregate_run(Path(args.run), member_files=True)  # the clients' files
        return {"peak_rss_bytes": peak_rss_bytes()}

    return processes.entry(body)


if __name__ == "__main__":
    sys.exit(main())
