"""Probes: what a module computes, measured by evaluating it or read off one observed call.

Nothing is read from a module's class: an activation is the reference it matches on a probe, a
norm the form its output takes, a modulation the affine fit between two observed tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from .. import _core

# The dtypes the core names; a weight in any other is not measured (and is `other` in the graph).
_DTYPES = {torch.float32: _core.DType.f32, torch.bfloat16: _core.DType.bf16,
           torch.float16: _core.DType.f16, torch.float64: _core.DType.f64}


def dtype_of(dt: torch.dtype) -> _core.DType:
    return _DTYPES.get(dt, _core.DType.other)


_PROBE = torch.linspace(-6.0, 6.0, 121)
# The torch reference of each activation the core names (flashrt/types.h): what a module is
# measured against. Names come from the core's enum, so there is one list of them.
_REFERENCE_ACTIVATIONS: dict[_core.Activation, Callable[[torch.Tensor], torch.Tensor]] = {
    _core.Activation.silu: torch.nn.functional.silu,
    _core.Activation.gelu_tanh: lambda t: torch.nn.functional.gelu(t, approximate="tanh"),
    _core.Activation.gelu: torch.nn.functional.gelu,
    _core.Activation.relu: torch.relu,
}


def measure_activation(module: nn.Module) -> _core.Activation | None:
    """What a parameter-free leaf module computes elementwise, by evaluating it; None when it is
    not an elementwise nonlinearity (it fails on a probe, changes the shape, or is the identity)."""
    if any(True for _ in module.parameters(recurse=False)) or any(True for _ in module.children()):
        return None
    try:
        with torch.no_grad():
            y = module(_PROBE.clone())
    except Exception:  # noqa: BLE001 - a module that cannot take a probe is simply not one
        return None
    if not isinstance(y, torch.Tensor) or y.shape != _PROBE.shape or y.dtype != _PROBE.dtype:
        return None
    if torch.equal(y, _PROBE):
        return None
    for act, fn in _REFERENCE_ACTIVATIONS.items():
        if torch.allclose(y, fn(_PROBE), atol=1e-5, rtol=1e-5):
            return act
    return _core.Activation.unknown


def measure_norm(module: nn.Module) -> tuple[int, _core.NormFacts] | None:
    """(width, its form and epsilon) for a leaf module with a 1-D weight that normalises its
    input's last dimension, by evaluating it: rms is x·w/rms(x), rms_one_plus x·(1+w)/rms(x),
    other anything else it computes over that width. None when the module is not such a leaf."""
    w = getattr(module, "weight", None)
    if (not isinstance(w, torch.Tensor) or w.dim() != 1 or any(True for _ in module.children())
            or w.dtype not in _DTYPES or w.device.type != "cpu"):
        return None
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(eps, (int, float)):
        return None
    width = w.shape[0]
    probe = torch.randn(2, width, generator=torch.Generator().manual_seed(5)).to(w.dtype)
    try:
        with torch.no_grad():
            got = module(probe)
    except Exception:  # noqa: BLE001 - not a norm over its weight's width
        return None
    if not isinstance(got, torch.Tensor) or got.shape != probe.shape:
        return None
    with torch.no_grad():
        p = probe.float()
        normed = p * torch.rsqrt(p.pow(2).mean(-1, keepdim=True) + eps)
        forms = {_core.NormForm.rms: normed * w.float(),
                 _core.NormForm.rms_one_plus: normed * (1.0 + w.float())}
    form = _core.NormForm.other
    for name, want in forms.items():
        if torch.allclose(got.float(), want, rtol=1e-4, atol=1e-5):
            form = name
            break
    return width, _core.NormFacts(form, float(eps))


def wrapped_linear(mod: nn.Module) -> nn.Linear | None:
    """The one Linear child of a parameter-free module that may apply an activation to it (a
    projection-then-activation module, as diffusers' GELU); None otherwise."""
    children = list(mod.children())
    if (len(children) != 1 or not isinstance(children[0], nn.Linear)
            or any(True for _ in mod.parameters(recurse=False))):
        return None
    return children[0]


def measure_wrapped(inner: torch.Tensor, outer: torch.Tensor) -> _core.Activation | None:
    """What a wrapping module computed on its Linear's output, from one observed call: the
    reference activation that maps the Linear's output to the module's, or None (anything
    else it computes leaves it a plain module)."""
    if inner.shape != outer.shape or inner.dtype != outer.dtype or torch.equal(inner, outer):
        return None
    with torch.no_grad():
        # In the call's own dtype, bit for bit first: a bf16 host rounds its activation's output
        # to bf16, which no fp32 tolerance fine enough to tell gelu from gelu_tanh admits. Only a
        # unique match counts (on a small bf16 call gelu and gelu_tanh may round alike).
        exact = [act for act, fn in _REFERENCE_ACTIVATIONS.items() if torch.equal(outer, fn(inner))]
        if len(exact) == 1:
            return exact[0]
        for act, fn in _REFERENCE_ACTIVATIONS.items():
            if torch.allclose(outer.float(), fn(inner.float()), atol=1e-5, rtol=1e-4):
                return act
    return None


def bare_leaf(mod: nn.Module) -> bool:
    """A leaf module without parameters: a norm without affine may be one (measured on its call)."""
    return (not any(True for _ in mod.children())
            and not any(True for _ in mod.parameters(recurse=False)))


def measure_bare_norm(x: torch.Tensor, out: torch.Tensor, eps: float) -> _core.NormForm | None:
    """What a parameter-free module computed on one observed call when it normalises the last
    dimension: layer (x - mean) / std, rms x / rms(x); None otherwise. Read on up to 64 rows."""
    if (out is x or out.shape != x.shape or x.dim() < 2 or x.shape[-1] < 2
            or not x.is_floating_point() or not out.is_floating_point()):
        return None
    with torch.no_grad():
        xs = x.reshape(-1, x.shape[-1])[:64].float()
        got = out.reshape(-1, out.shape[-1])[:64].float()
        if torch.equal(xs, got):
            return None
        tol = 1e-3 if out.dtype == torch.float32 else 3e-2
        forms = {_core.NormForm.layer: torch.nn.functional.layer_norm(xs, xs.shape[-1:],
                                                                        eps=eps),
                 _core.NormForm.rms: xs * torch.rsqrt(xs.pow(2).mean(-1, keepdim=True) + eps)}
        for name, want in forms.items():
            if torch.allclose(got, want, atol=tol, rtol=tol):
                return name
    return None


def fit_modulation(n: torch.Tensor, x: torch.Tensor) -> bool:
    """Whether x is a per-channel affine function of n (x = n*scale + shift, scale and shift per
    channel and per leading sample), fitted over the rows, and not n itself."""
    if x is n or x.shape != n.shape or x.dim() < 2 or x.shape[-1] < 2:
        return False
    with torch.no_grad():
        batch = x.shape[0] if x.dim() >= 3 else 1
        xs = x.reshape(batch, -1, x.shape[-1]).double()
        ns = n.reshape(batch, -1, n.shape[-1]).double()
        if xs.shape[1] < 4:  # too few rows to tell a per-channel fit from a coincidence
            return False
        mx, mn = xs.mean(1, keepdim=True), ns.mean(1, keepdim=True)
        var = (ns - mn).pow(2).mean(1, keepdim=True)
        scale = ((ns - mn) * (xs - mx)).mean(1, keepdim=True) / var.clamp_min(1e-30)
        shift = mx - scale * mn
        resid = xs - (ns * scale + shift)
        tol = 1e-4 if x.dtype == torch.float32 else 2e-2
        if resid.norm() > tol * xs.norm():
            return False
        return not (torch.allclose(scale, torch.ones_like(scale), atol=1e-6)
                    and torch.allclose(shift, torch.zeros_like(shift), atol=1e-6))
