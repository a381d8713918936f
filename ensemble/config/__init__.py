"""Run configuration: the TOML dataclasses (`schema`), their type checks (`values`), range checks
and bounds, search spaces.

The public face re-exports the schema's main names: `from ensemble.config import Config, load`.
"""
from ensemble.config.schema import Config, from_dict, load

__all__ = ["Config", "from_dict", "load"]
