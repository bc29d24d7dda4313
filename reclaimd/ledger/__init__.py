"""The restart-waste ledger: labels, the event, and its durable, exactly-once publication.

In the order data flows: ``labels`` (the cost labels and the policy on what reaches an event),
``event`` (one FOCUS-aligned row per gang, its Kafka key and headers), ``writer``
(``LedgerWriter``: record, flush, run, close) over its loops: ``publisher`` (outbox -> Kafka,
one transaction per batch) and ``adoption`` (tombstones, and taking over the events of a dead
holder), with ``fencing`` (transactional ids, fencing a holder, reading what is committed),
``records`` (the cluster records as the publisher sees them) and ``signals`` (what the loops
share). Importers name the module they use; this package re-exports nothing.
"""
