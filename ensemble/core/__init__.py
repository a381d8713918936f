"""Core: errors, atomic durable files and staging names, run locks, signals, fault messages, the quiet TensorFlow import. Imports nothing else of the project."""
