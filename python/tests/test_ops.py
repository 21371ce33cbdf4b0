"""The kernel ops through the door, on torch tensors: results against torch on the same
dequantised weights, and every bad input refused by name (never a crash, never a copy)."""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn.functional as F

import flashrt_structures as frt
from flashrt_structures import ops

FORMATS = [
    ("int8", lambda w: ops.pack_int8(w)),
    ("int4_g32_sym", lambda w: ops.pack_int4(w, 32, True)),
    ("int4_g64_asym", lambda w: ops.pack_int4(w, 64, False)),
    ("int4_g128_sym", lambda w: ops.pack_int4(w, 128, True)),
]


def dequant(p: ops.PackedLinear) -> torch.Tensor:
    return torch.from_numpy(p.dequantize())


@pytest.mark.parametrize("name,pack", FORMATS)
@pytest.mark.parametrize("m", [1, 3, 8, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_matches_torch_on_the_dequantised_weight(name, pack, m, dtype):
    torch.manual_seed(m)
    w = torch.randn(200, 256) * 0.05
    b = torch.randn(200)
    p = pack(w)
    x = torch.randn(m, 256).to(dtype)
    y = ops.linear(x, p, b)
    assert y.dtype == dtype and y.shape == (m, 200)
    ref = F.linear(x.float().double(), dequant(p).double(), b.double())
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(y.double(), ref, rtol=tol, atol=tol)


def test_pack_reports_round_trip_error_and_leaves_the_host_weight_alone():
    lin = torch.nn.Linear(256, 96)
    before = lin.weight.detach().clone()
    p8 = ops.pack_int8(lin.weight)  # a Parameter that requires grad
    p4 = ops.pack_int4(lin.weight, 32, False)
    assert torch.equal(lin.weight.detach(), before)
    assert 0 < p8.stats.rel_err < 0.01 < p4.stats.rel_err < 0.15
    assert p8.stats.max_abs_err <= float(before.abs().max()) / 127 * 0.5 + 1e-7
    assert p8.form == "int8 per-channel" and p4.form == "int4 g32 asymmetric"
    assert p8.nbytes == 96 * 256 + 96 * 4


@pytest.mark.parametrize("name,pack", FORMATS + [
    ("w8a8", lambda w: ops.pack_int8_gemm(w, 32)),
    ("w4a8_asym", lambda w: ops.pack_int4_gemm(w, False)),
    ("int4_super", lambda w: ops.pack_int4_super(w)),
])
def test_a_copy_computes_the_same_bits_after_its_original_is_gone(name, pack):
    w = torch.randn(48, 256) * 0.05
    original = pack(w)
    copy = original.copy()
    x = torch.randn(3, 256)
    want = ops.linear(x, original)
    values = original.dequantize()
    assert (copy.form, copy.nbytes) == (original.form, original.nbytes)
    del original
    assert torch.equal(ops.linear(x, copy), want)
    assert (copy.dequantize() == values).all()


def test_bf16_weight_packs_like_its_float_values():
    w = (torch.randn(64, 128) * 0.05).to(torch.bfloat16)
    a, b = ops.pack_int8(w), ops.pack_int8(w.float())
    assert torch.equal(dequant(a), dequant(b))


def test_strided_rows_are_read_in_place():
    w = torch.randn(48, 128) * 0.05
    p = ops.pack_int8(w)
    wide = torch.randn(4, 300)
    x = wide[:, 10:138]  # row stride 300, inner stride 1: viewable without a copy
    torch.testing.assert_close(ops.linear(x, p), F.linear(x, dequant(p)), rtol=1e-4, atol=1e-4)


def test_ffn_matches_torch_for_both_activations():
    torch.manual_seed(1)
    g, u, d = (torch.randn(384, 128) * 0.05, torch.randn(384, 128) * 0.05,
               torch.randn(128, 384) * 0.05)
    for pack in (ops.pack_int8, lambda t: ops.pack_int4(t, 64, True)):
        pg, pu, pd = pack(g), pack(u), pack(d)
        x = torch.randn(5, 128)
        for act, fn in (("silu", F.silu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh"))):
            y = ops.ffn(x, pg, pu, pd, act)
            ref = F.linear(fn(F.linear(x, dequant(pg))) * F.linear(x, dequant(pu)), dequant(pd))
            torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    "make_x,reason",
    [
        (lambda: torch.randn(1, 64, dtype=torch.float64), "dtype float64"),
        (lambda: torch.randn(1, 64).half(), "dtype float16"),
        (lambda: torch.randint(0, 3, (1, 64)), "dtype int64"),
        (lambda: torch.randn(1, 64, device="meta"), "not viewable as a CPU tensor"),
        (lambda: torch.randn(64, 2).t(), "not contiguous"),
        (lambda: torch.randn(2, 128)[:, ::2], "not contiguous"),
        (lambda: torch.randn(3, 32), "width 32, expected 64"),
        (lambda: torch.randn(17, 64), "outside the decode band 1..16"),
        (lambda: torch.randn(2, 3, 64), "expected a 2-D"),
    ],
)
def test_bad_inputs_are_refused_by_name(make_x, reason):
    p = ops.pack_int8(torch.randn(32, 64))
    with pytest.raises(frt.Refused, match=reason):
        ops.linear(make_x(), p)


def test_bad_weights_and_arguments_raise_clear_errors():
    with pytest.raises(ValueError, match="not a multiple of group 32"):
        ops.pack_int4(torch.randn(16, 100), 32, True)
    with pytest.raises(ValueError, match=r"not in \{32, 64, 128\}"):
        ops.pack_int4(torch.randn(16, 96), 48, True)
    w = torch.randn(16, 64)
    w[3, 5] = float("nan")
    with pytest.raises(ValueError, match=r"\[3, 5\] is nan"):
        ops.pack_int8(w)
    p = ops.pack_int8(torch.randn(16, 64))
    with pytest.raises(frt.Refused, match="bias"):
        ops.linear(torch.randn(1, 64), p, torch.randn(15))
    with pytest.raises(ValueError, match="activation 'relu'"):
        ops.ffn(torch.randn(1, 64), p, p, ops.pack_int8(torch.randn(64, 16)), "relu")


def test_non_finite_inputs_propagate_without_crashing():
    p = ops.pack_int8(torch.randn(32, 64))
    x = torch.randn(2, 64)
    x[0, 3] = float("nan")
    x[1, 7] = float("inf")
    y = ops.linear(x, p)
    assert torch.isnan(y[0]).all()
    assert not torch.isfinite(y[1]).any()


def test_a_second_thread_gets_the_same_answer():
    torch.manual_seed(2)
    p = ops.pack_int8(torch.randn(512, 256) * 0.05)
    xs = [torch.randn(2, 256) for _ in range(4)]
    want = [ops.linear(x, p) for x in xs]
    got: dict[int, list[torch.Tensor]] = {}

    def worker(i: int) -> None:
        got[i] = [ops.linear(xs[j], p) for j in range(4) for _ in range(50)][::50]

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i in range(3):
        for a, b in zip(got[i], want):
            assert torch.equal(a, b)


def test_one_and_two_threads_agree_bitwise():
    p = ops.pack_int4(torch.randn(300, 256) * 0.05, 32, True)
    x = torch.randn(3, 256)
    assert torch.equal(ops.linear(x, p, threads=1), ops.linear(x, p, threads=2))


def test_kernels_run_on_torchs_own_openmp_team():
    assert "OpenMP" in torch.__config__.parallel_info()
    assert frt.PARALLEL_BACKEND.startswith("host OpenMP team")


def test_read_bandwidth_is_measured():
    assert ops.read_bandwidth_gbps(64 << 20, repeats=2) > 0.5
