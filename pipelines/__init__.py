"""Pipelines: train, predict, evaluate, aggregate, compare, benchmark; the CLI lives here."""
