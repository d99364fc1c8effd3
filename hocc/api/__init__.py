"""The public calls (drop-in for torch.distributed's)."""
