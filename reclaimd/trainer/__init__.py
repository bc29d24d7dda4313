"""reclaimd's trainer SDK: the checkpoint-signal contract for ordinary training loops.

Importable without the controller's libraries (boto3, kubernetes-asyncio, grpc, OpenTelemetry,
aiohttp): a trainer image carries only this package and what its framework needs
(``tests/unit/test_trainer_imports.py`` proves it in a subprocess that blocks them).

- ``Signal``: a background thread serves reclaimd's POSTs; the loop checks ``signal.requested``
  at step boundaries and calls ``signal.ack(result)``.
- ``reclaimd.trainer.torch``: ``Checkpointer``, torch.distributed.checkpoint with a local stash,
  each rank's shards uploaded at reclaimd's share of the tenant's PutObject budget, one step
  agreed by all ranks, ``restore()`` of the newest complete checkpoint.
- ``reclaimd.trainer.lightning``, ``reclaimd.trainer.hf``: callbacks for PyTorch Lightning and
  the Hugging Face ``Trainer``.
"""

from reclaimd.trainer.contract import (
    CheckpointRequest,
    CheckpointResult,
    ObjectPut,
    upload_checkpoint,
    upload_parts,
)
from reclaimd.trainer.signal import Signal

__all__ = [
    "CheckpointRequest",
    "CheckpointResult",
    "ObjectPut",
    "Signal",
    "upload_checkpoint",
    "upload_parts",
]
