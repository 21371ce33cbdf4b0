"""decode_loop's self-check figures: what the worst position's logits cosine and the worst
cached key's cosine read against the host, per host and scheme (the floors in
catalog/gates.yaml self_checks.decode_loop are set from these), and the one host the loop
computes wrongly (Ernie 4.5's interleaved rotary), which the keys must refuse.

Hosts from their config classes with random weights (the test hosts' sizes) and the real
SmolLM2-135M-Instruct Q4_1 GGUF; each scheme attached with auto_swaps before the loop is built.
Accuracy figures, not timings: the read bandwidth is recorded beside the machine as with every
result.

    .venv/bin/python bench/self_check.py        # bench/results/<tier>/self_check.json
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from transformers import Ernie4_5Config, Ernie4_5ForCausalLM

import flashrt_structures as S
from flashrt_structures import smollm2

from _common import machine, probe, result_path, write_result

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import hosts  # noqa: E402  (the test hosts: one definition of their sizes)

SCHEMES = [None, "w8a16_decode", "w4a16_decode", "w8a8_decode", "w4a8_decode"]


def measure(model: torch.nn.Module, scheme: str | None) -> dict[str, Any]:
    handle = None
    if scheme is not None:
        ids = torch.tensor([[1, 2, 3, 4]])
        handle = S.auto_swaps(model, lambda: model(ids), scheme=scheme).attach(model)
    try:
        loop = S.decode_loop(model, max_len=64)
        return {"accepted": True, **loop.self_check}
    except S.Refused as e:
        return {"accepted": False, "refusal": str(e)}
    finally:
        if handle is not None:
            handle.detach()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    rows: list[dict[str, Any]] = []
    for name, make in (("qwen3", hosts.qwen3), ("llama", hosts.llama)):
        for scheme in SCHEMES:
            rows.append({"host": name, "scheme": scheme or "host weights",
                         **measure(make(), scheme)})
    _, smol = smollm2.load()
    for scheme in SCHEMES:
        rows.append({"host": "smollm2-135m", "scheme": scheme or "host weights",
                     **measure(smol, scheme)})
    report = S.adopt_prequantized(smol, "gguf", smollm2.checkpoint())
    rows.append({"host": "smollm2-135m", "scheme": "adopted Q4_1 GGUF", **measure(smol, None)})
    report.handle.detach()
    torch.manual_seed(0)
    ernie = Ernie4_5ForCausalLM(Ernie4_5Config(
        vocab_size=hosts.VOCAB, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256)).eval()
    rows.append({"host": "ernie4_5 (interleaved rotary)", "scheme": "host weights",
                 **measure(ernie, None)})
    floors = S.catalog.shipped().decode_self_check
    result = {"machine": machine(), "read_bandwidth_gbps": probe(),
              "floors": {"probe_tokens": floors.probe_tokens,
                         "top1_agreement": floors.top1_agreement,
                         "logits_cosine": floors.logits_cosine,
                         "keys_cosine": floors.keys_cosine},
              "rows": rows}
    print(f"{'host':32} {'scheme':20} {'logits cos':>12} {'keys cos':>12}  verdict")
    for r in rows:
        if r["accepted"]:
            print(f"{r['host']:32} {r['scheme']:20} {r['min_cosine']:12.7f} "
                  f"{r['min_keys_cosine']:12.7f}  passed")
        else:
            print(f"{r['host']:32} {r['scheme']:20} {'':12} {'':12}  {r['refusal'][:70]}")
    write_result(result_path(args.json, "self_check"), result)


if __name__ == "__main__":
    main()
