"""Replication: devices, clusters, placement, THE training loop (replicas included), in-graph replication and the between-graph client."""
