"""Command-line tools: `hocc plan` and `hocc calibrate` (no torch.distributed needed)."""
