"""Game days (``reclaimd drill run --cluster``): a drill against the reclaimd already deployed,
read and cleaned up."""
