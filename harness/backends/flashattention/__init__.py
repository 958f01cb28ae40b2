"""FlashAttention 2, 3 and 4: the adapter (dense, packed, paged) and each generation's rules, from its own source."""
