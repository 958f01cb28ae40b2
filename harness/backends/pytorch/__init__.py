"""Torch's own kernels: eager (naive, eager FP8, MLA's absorbed form, the layer and its projections), SDPA and its kernels, FlexAttention, torch.compile."""
