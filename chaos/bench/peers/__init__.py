"""``make bench-peers``: NTH and reclaimd on one Spot storm, side by side (``run`` holds the command
line and the wiring)."""
