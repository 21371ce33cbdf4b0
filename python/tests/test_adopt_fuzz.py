"""A seeded corpus of mutated GGUF files through adopt_prequantized: truncations, flipped header
and data bytes, wrong tensor types, overlapping and out-of-file offsets. Every input is refused
with the project's error (S.Refused) or adopted exactly (every seated weight the host's own), and
the host's bytes never change."""

from __future__ import annotations

import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

import flashrt_structures as S

import gguf_files
import hosts

CASES = 12  # per mutation kind and file


def _tensor_fields(path: Path) -> tuple[list[tuple[int, int]], int]:
    """Where each tensor's type (u32) and data offset (u64) lie in the file, and where the
    tensor data starts."""
    reader = gguf.GGUFReader(str(path))
    raw = path.read_bytes()
    out = []
    for t in reader.tensors:
        # A tensor info: name (u64 length + bytes), n_dims (u32), dims (u64 each), type, offset.
        at = t.field.offset + 8 + len(t.name.encode()) + 4 + 8 * len(t.shape)
        assert struct.unpack_from("<I", raw, at)[0] == int(t.tensor_type), t.name
        out.append((at, at + 4))
    return out, reader.data_offset


def _mutants(path: Path, rng: np.random.Generator) -> list[tuple[str, bytes]]:
    raw = path.read_bytes()
    fields, data_at = _tensor_fields(path)
    offsets = [struct.unpack_from("<Q", raw, o)[0] for _, o in fields]
    out: list[tuple[str, bytes]] = []
    for i in range(CASES):
        cut = int(rng.integers(1, len(raw)))
        out.append((f"truncated at {cut}", raw[:cut]))
        b = bytearray(raw)
        for at in rng.integers(0, data_at, size=int(rng.integers(1, 5))):
            b[at] ^= 1 << int(rng.integers(0, 8))
        out.append((f"header flips {i}", bytes(b)))
        b = bytearray(raw)
        for at in rng.integers(data_at, len(raw), size=int(rng.integers(1, 9))):
            b[at] ^= 1 << int(rng.integers(0, 8))
        out.append((f"data flips {i}", bytes(b)))
        b = bytearray(raw)
        t = int(rng.integers(0, len(fields)))
        struct.pack_into("<I", b, fields[t][0], int(rng.integers(0, 42)))
        out.append((f"tensor {t} typed {struct.unpack_from('<I', b, fields[t][0])[0]}", bytes(b)))
        b = bytearray(raw)
        t, u = (int(x) for x in rng.integers(0, len(fields), size=2))
        struct.pack_into("<Q", b, fields[t][1], offsets[u])
        out.append((f"tensor {t} at tensor {u}'s offset", bytes(b)))
        b = bytearray(raw)
        struct.pack_into("<Q", b, fields[t][1], len(raw) + int(rng.integers(0, 1 << 20)))
        out.append((f"tensor {t} past the end", bytes(b)))
    return out


@pytest.mark.parametrize("qtype,activations", [("Q8_0", "host"), ("Q4_K", "host"),
                                                ("Q5_K", "int8")])
def test_every_mutated_file_is_refused_or_adopted_exactly_and_the_host_untouched(tmp_path, qtype,
                                                                                  activations):
    model = hosts.qwen3(1)
    good = gguf_files.write(model, tmp_path / "good.gguf", qtype)
    snap = hosts.snapshot(model)
    x = hosts.ids(3)
    with torch.no_grad():
        want = model(x).logits
    rng = np.random.default_rng(20261203)
    outcomes = {"refused": 0, "adopted": 0}
    for what, data in _mutants(good, rng):
        path = tmp_path / "mutant.gguf"
        path.write_bytes(data)
        try:
            report = S.adopt_prequantized(model, "gguf", path, activations=activations)
        except S.Refused:
            outcomes["refused"] += 1
        else:
            outcomes["adopted"] += 1
            try:
                # Adopted: every seated weight is exactly what the host holds.
                assert report.worst_conversion <= 1e-6, (what, report.conversion)
                with torch.no_grad():
                    got = model(x).logits
                cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), dim=0)
                # (int8 activations: the activations' rounding on top of the file's values)
                assert float(cos) >= (0.9999 if activations == "host" else 0.999), (what,
                                                                                    float(cos))
            finally:
                if report.handle is not None:
                    report.handle.detach()
        assert not S.attached(model), what
        assert hosts.same_weights(model, snap), what
    # The corpus exercises both outcomes' paths: most mutants are refused.
    print(qtype, outcomes)
    assert outcomes["refused"] > CASES, outcomes
