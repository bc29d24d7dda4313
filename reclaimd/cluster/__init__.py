"""The cluster side: what the daemon knows about, and does to, Kubernetes.

``watch`` owns the LIST+WATCH protocol; ``cache`` keeps the indexes built from it (nodes by
provider and instance id, GPU pods by node, gang and Kueue workload); ``gangs`` is the pure
mapping from a pod to its gang and rank; ``claims`` is the durable, optimistic-concurrency
claim on a node or workload; ``actions`` cordons, taints and evicts; every write goes through
the earliest-deadline-first limiter in ``ratelimit``; ``connect`` builds the API client and
``errors`` maps API errors to ours.
"""
