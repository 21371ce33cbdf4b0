"""flashrt/gemm's sequence attention through the door (ops.sequence_attention): against torch's
fp32 attention over the same bf16 values, in the layouts a DiT's attention processor hands over,
and every input it does not compute refused by name with the output untouched."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import flashrt_structures as frt
from flashrt_structures import ops


def heads(b: int, n: int, h: int, d: int, processor_layout: bool) -> torch.Tensor:
    """[b, h, n, d] bf16: a projection's [b, n, h * d] output viewed per head (a diffusers
    processor's `view(...).transpose(1, 2)`), or contiguous."""
    if processor_layout:
        return torch.randn(b, n, h * d).bfloat16().view(b, n, h, d).transpose(1, 2)
    return torch.randn(b, h, n, d).bfloat16()


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float) -> torch.Tensor:
    group = q.shape[1] // k.shape[1]
    k, v = (t.float().repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.float(), k, v, scale=scale)


@pytest.mark.parametrize("processor_layout", [True, False])
@pytest.mark.parametrize("b,h,kvh,nq,nk,d", [(1, 4, 4, 40, 300, 72), (2, 4, 2, 17, 129, 64),
                                             (1, 2, 1, 33, 70, 130), (1, 3, 3, 1, 1, 37)])
def test_matches_fp32_attention_within_bf16_roundings(processor_layout, b, h, kvh, nq, nk, d):
    torch.manual_seed(nq * 7 + nk)
    q = heads(b, nq, h, d, processor_layout)
    k, v = heads(b, nk, kvh, d, processor_layout), heads(b, nk, kvh, d, processor_layout)
    out = ops.sequence_attention(q, k, v)  # scale d ** -0.5 by default
    assert out.dtype == torch.bfloat16 and out.shape == (b, h, nq, d)
    ref = reference(q, k, v, d ** -0.5).double()
    # bf16's rounding (2^-9) of the output, and of the weights where the tiles take them, each
    # at most doubled by fp32's sums: the kernel tests' bound.
    bound = 2.0 ** -8 * (ref.abs() + v.float().abs().max().item())
    assert ((out.double() - ref).abs() <= bound).all()


def test_writes_into_the_output_it_is_given_in_any_layout():
    q, k, v = (heads(1, 20, 2, 16, True) for _ in range(3))
    out = torch.full((1, 20, 2, 16), float("nan"), dtype=torch.bfloat16).transpose(1, 2)
    got = ops.sequence_attention(q, k, v, 0.3, out=out)
    assert got is out and not out.isnan().any()
    ref = reference(q, k, v, 0.3).double()
    assert ((out.double() - ref).abs() <= 2.0 ** -8 * (ref.abs() + 4.0)).all()


def test_refuses_what_it_does_not_compute_and_leaves_the_output():
    q, k, v = (heads(1, 8, 2, 16, False) for _ in range(3))
    out = torch.zeros(1, 2, 8, 16, dtype=torch.bfloat16)
    cases = {
        "takes bf16": (q.float(), k.float(), v.float(), out.float()),
        "4-D": (q[0], k[0], v[0], out[0]),
        "head_dim not contiguous":
            (q, k, v, torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)[..., ::2]),
        "positions of 16": (q, k[:, :, :5], v, out),
        "heads differ": (q, k, v[:, :1], out),
    }
    for reason, (qq, kk, vv, oo) in cases.items():
        before = oo.clone()
        assert reason in ops.sequence_attention_refusal(qq, kk, vv, oo, 0.25), reason
        with pytest.raises((frt.Refused, frt.KernelUnavailable), match=reason):
            ops.sequence_attention(qq, kk, vv, 0.25, out=oo)
        assert torch.equal(oo, before), reason
    assert ops.sequence_attention_refusal(q, k, v, out, 0.25) == ""
    with pytest.raises(frt.Refused, match="is not finite"):
        ops.sequence_attention(q, k, v, float("inf"), out=out)
    wide = torch.zeros(1, 1, 4, 600, dtype=torch.bfloat16)
    with pytest.raises(frt.KernelUnavailable, match="heads of 600"):
        ops.sequence_attention(wide, wide, wide)
