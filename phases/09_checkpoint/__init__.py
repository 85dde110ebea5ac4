"""Phase 09: activation checkpointing of the TransformerNP's blocks -- step time, tokens/s and peak memory with and without it, at the shape's batch and at the largest batch that fits."""
