"""reclaimd: gang-aware interruption and reclaim controller."""

__version__ = "0.1.0"
