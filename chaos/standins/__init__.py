"""Stand-ins for the cloud metadata servers (Azure IMDS, GCE metadata): one each, shared by the
drills and ``make bench-fuzz``."""
