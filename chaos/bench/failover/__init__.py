"""``make bench-failover``: a randomized fault campaign (``run``), each run's scenario generated
from its seed (``scenario``)."""
