"""Core: errors, atomic durable files and staging names, run locks, signals, fault messages, the quiet TensorFlow import. Imports nothing else of the project."""

VERSION = "0.1.0"  # the package's version (pyproject.toml's), recorded in every manifest
