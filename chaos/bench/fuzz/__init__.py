"""``make bench-fuzz`` (``python -m chaos.bench.fuzz.run``): hostile input on every transport of one
real ``reclaimd run``: run (the run and its command line), send, watch, report, common."""
