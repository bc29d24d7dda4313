"""Drills (``reclaimd drill``): a scenario planned, its world built on the local stack, its
notices injected and its faults struck, watched, and judged into a verdict."""
