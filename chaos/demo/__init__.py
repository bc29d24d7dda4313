"""``make demo``: one notice through SQS, the storm drill's bill, and what the storm cost."""
