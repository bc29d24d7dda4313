"""A replica's peak RSS is its own: the storm and failover benches read it from the last log
line, and replicas are started by a test runner or drill far larger than they are."""

from __future__ import annotations

import subprocess
import sys

PARENT = """
import subprocess, sys
ballast = bytearray(600 * 1024 * 1024)  # a parent with 600 MB resident
ballast[::4096] = b"x" * len(ballast[::4096])
child = "from reclaimd.daemon import peak_rss_mb; import resource; " \\
        "print(peak_rss_mb(), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)"
print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True,
                     check=True).stdout)
"""


def test_a_child_of_a_large_parent_reports_its_own_peak() -> None:
    out = subprocess.run(
        [sys.executable, "-c", PARENT], capture_output=True, text=True, check=True
    ).stdout.split()
    own, inherited = float(out[0]), float(out[1])
    assert inherited >= 600  # ru_maxrss: the parent's peak, kept across execve
    assert 0 < own < 400  # VmHWM: the child's own (it imports the daemon, not 600 MB)
