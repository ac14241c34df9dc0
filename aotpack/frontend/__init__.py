"""Stage 1: the model file contract and torch.export."""
