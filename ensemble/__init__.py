"""Ensemble training and aggregation with in-graph and between-graph replication.

Blocks only: configuration, data, device placement, members, the two builders, aggregators,
metrics and artifacts. The pipelines and the CLI live in the `pipelines` package.
"""

__version__ = "0.1.0"
