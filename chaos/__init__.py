"""The drill rig, by purpose: drill/ (``reclaimd drill``), gameday/ (a drill against a release),
bench/ (the ``make bench-*``), standins/ (the cloud metadata servers), demo/ (``make demo``),
and what they share at this level (the harness, senders over the real transports, the kwok
fleet and fake trainers, the stack, ports, processes and proxies)."""
