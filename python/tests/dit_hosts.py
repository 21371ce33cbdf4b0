"""Real diffusers DiT transformers from small configs (random weights), each with one denoising
step's realistic inputs: latents, a timestep, text embeddings (and what the family also takes).
Widths of 512 so the attention and feed-forward projections reach 262,144 weights; 256 or more
latent tokens so the projections see many-row calls, as a DiT step does."""

from __future__ import annotations

from collections.abc import Callable

import torch
from diffusers import (
    FluxTransformer2DModel,
    PixArtTransformer2DModel,
    SD3Transformer2DModel,
    WanTransformer3DModel,
)
from torch import nn

Step = Callable[[], object]
TEXT = 12


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def pixart(layers: int = 2, text: int = TEXT) -> tuple[nn.Module, Step]:
    torch.manual_seed(21)
    m = PixArtTransformer2DModel(num_attention_heads=8, attention_head_dim=64, in_channels=4,
                                 out_channels=8, num_layers=layers, cross_attention_dim=512,
                                 sample_size=32, patch_size=2, caption_channels=64,
                                 norm_type="ada_norm_single",
                                 use_additional_conditions=False).eval()
    g = _gen(1)
    x, e = torch.randn(1, 4, 32, 32, generator=g), torch.randn(1, text, 64, generator=g)
    t = torch.tensor([500])
    return m, lambda: m(x, encoder_hidden_states=e, timestep=t)


def sd3(layers: int = 2, text: int = TEXT) -> tuple[nn.Module, Step]:
    torch.manual_seed(22)
    m = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=4, num_layers=layers,
                              attention_head_dim=64, num_attention_heads=8,
                              joint_attention_dim=64, caption_projection_dim=512,
                              pooled_projection_dim=32, out_channels=4,
                              pos_embed_max_size=32).eval()
    g = _gen(2)
    x, e = torch.randn(1, 4, 32, 32, generator=g), torch.randn(1, text, 64, generator=g)
    p, t = torch.randn(1, 32, generator=g), torch.tensor([500])
    return m, lambda: m(x, encoder_hidden_states=e, pooled_projections=p, timestep=t)


def flux(layers: int = 1, in_channels: int = 16, side: int = 16) -> tuple[nn.Module, Step]:
    torch.manual_seed(23)
    m = FluxTransformer2DModel(patch_size=1, in_channels=in_channels, num_layers=layers,
                               num_single_layers=layers, attention_head_dim=64,
                               num_attention_heads=8, joint_attention_dim=64,
                               pooled_projection_dim=32, axes_dims_rope=(16, 24, 24)).eval()
    g, n = _gen(3), side * side
    x = torch.randn(1, n, in_channels, generator=g)
    e, p = torch.randn(1, TEXT, 64, generator=g), torch.randn(1, 32, generator=g)
    t = torch.tensor([0.5])
    img_ids = torch.zeros(n, 3)
    img_ids[:, 1], img_ids[:, 2] = torch.arange(n) // side, torch.arange(n) % side
    txt_ids = torch.zeros(TEXT, 3)
    return m, lambda: m(x, encoder_hidden_states=e, pooled_projections=p, timestep=t,
                        img_ids=img_ids, txt_ids=txt_ids)


def wan(layers: int = 2, text: int = TEXT) -> tuple[nn.Module, Step]:
    torch.manual_seed(24)
    m = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=8, attention_head_dim=64,
                              in_channels=4, out_channels=4, text_dim=64, freq_dim=32,
                              ffn_dim=1024, num_layers=layers, rope_max_seq_len=64).eval()
    g = _gen(4)
    x, e = torch.randn(1, 4, 2, 32, 32, generator=g), torch.randn(1, text, 64, generator=g)
    t = torch.tensor([500])
    return m, lambda: m(x, timestep=t, encoder_hidden_states=e)


FAMILIES = {"pixart": pixart, "sd3": sd3, "flux": flux, "wan": wan}
