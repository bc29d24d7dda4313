"""Where the public sample payloads live: ``shared/fixtures`` beside the checkout (CI lays a
copy of shared/ next to its fresh clone, as it is next to the developers' checkouts)."""

from pathlib import Path

FIXTURES = Path(__file__).resolve().parents[2].parent / "shared" / "fixtures"
