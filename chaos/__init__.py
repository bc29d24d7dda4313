"""Chaos drills: fake fleets, injectors over the real transports, scenarios and verdicts."""
