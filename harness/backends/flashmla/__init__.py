"""DeepSeek's FlashMLA: absorbed MLA decode over a paged latent cache."""
