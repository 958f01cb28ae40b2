"""xFormers' memory_efficient_attention: its calls (dense, packed, paged) and what it takes."""
