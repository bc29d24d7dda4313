"""reclaimd's trainer SDK: the checkpoint-signal contract for ordinary training loops.

A distribution of its own, ``reclaimd-trainer``, owning no file of the controller's and
importing nothing of it. Importable without the controller's libraries (boto3,
kubernetes-asyncio, grpc, OpenTelemetry, aiohttp): a trainer image carries only this package and
what its framework needs (``tests/unit/test_trainer_imports.py`` proves it in a subprocess that
blocks them).

- ``Signal``: a background thread serves reclaimd's POSTs; the loop checks ``signal.requested``
  at step boundaries and calls ``signal.ack(result)``.
- ``reclaimd_trainer.torch``: ``Checkpointer``, torch.distributed.checkpoint with a local stash,
  each rank's shards uploaded at reclaimd's share of the tenant's PutObject budget, one step
  agreed by all ranks, ``restore()`` of the newest complete checkpoint.
- ``reclaimd_trainer.lightning``, ``reclaimd_trainer.hf``: callbacks for PyTorch Lightning and
  the Hugging Face ``Trainer``.
- ``reclaimd_trainer.s3`` (extra ``s3``: boto3): ``GuardedPut``, the upload that keeps to the
  tenant's prefix and paces at reclaimd's share; ``make_s3_client``.
- ``reclaimd_trainer.server`` (extra ``aio``: aiohttp): ``CheckpointServer`` for asyncio trainers.
"""

from reclaimd_trainer.contract import (
    CheckpointRequest,
    CheckpointResult,
    ObjectPut,
    upload_checkpoint,
    upload_parts,
)
from reclaimd_trainer.signal import Signal

__version__ = "0.1.0"

__all__ = [
    "CheckpointRequest",
    "CheckpointResult",
    "ObjectPut",
    "Signal",
    "upload_checkpoint",
    "upload_parts",
]
