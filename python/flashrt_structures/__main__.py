"""python -m flashrt_structures [kernels [--json] | tune [--out PATH] | demo]"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from . import impls


def print_kernels(report: dict) -> None:
    cpu = report["cpu"]
    print(f"CPU: {cpu['arch']}/{cpu['os']}, best tier {cpu['tier']}, {report['threads']} threads")
    print(f"     features: {' '.join(cpu['features'])}")
    for p in report["packages"]:
        where = f"{p['source']} {p['dir']}" if p["dir"] else "not found"
        print(f"\n{p['repo']} {p['version'] or '?'} rev {p['revision'] or '?'} ({where})")
        print(f"  chosen: {p['chosen'] or 'NONE'}")
        for v in p["variants"]:
            mark = "*" if v["chosen"] else " "
            print(f"  {mark} {v['name']:<32} {v['reason'] or 'chosen'}")
    print()
    if not report["unavailable"]:
        print("unavailable: none")
    for e in report["unavailable"]:
        print(f"unavailable: {e['repo']} {e['version']}: {e['error']}")
        print(f"             {e['detail']}")


def tune(args: argparse.Namespace) -> int:
    from . import decisions

    out = args.out or Path(decisions.path() or decisions.default_path())
    shapes = ([tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
              if args.shapes else None)
    rows = [int(r) for r in args.rows.split(",")] if args.rows else None
    if rows and min(rows) <= 16:
        print("tune: --rows must be above the decode band (16)", file=sys.stderr)
        return 2
    result = decisions.tune(out, rounds=args.rounds, shapes=shapes, rows=rows)  # type: ignore[arg-type]
    print(f"CPU: {result['cpu']}, tier {result['tier']}, gemm {result['gemm_variant']}")
    for name, m in {**result["forms"], **result["not_decided"]}.items():
        curve = ", ".join(f"{r}:{g:.2f}" for r, g in m["geomean_by_rows"].items())
        band = m["rows_min"] if m["rows_min"] is not None else "none (catalog's default stays)"
        print(f"{name}: rows from {band} (catalog default {m['catalog_default']}); speedup over "
              f"the host by rows: {curve}")
    print(f"wrote {out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_structures")
    sub = parser.add_subparsers(dest="command")
    k = sub.add_parser("kernels", help="kernel packages, variants, the chosen one, and refusals")
    k.add_argument("--json", action="store_true", help="print the same as JSON")
    t = sub.add_parser("tune", help="re-measure the catalog's row bands on this machine and write "
                                    "the decisions file plans read (flashrt_structures.decisions)")
    t.add_argument("--out", type=Path, default=None,
                   help="where to write it (default $FLASHRT_DECISIONS, else "
                        "~/.cache/flashrt/decisions.json)")
    t.add_argument("--rounds", type=int, default=5)
    t.add_argument("--shapes", default=None, help="K x N list, e.g. 1152x4608,3072x3072")
    t.add_argument("--rows", default=None, help="row counts above 16, e.g. 17,24,32,64")
    d = sub.add_parser("demo", help="the main job: chat with SmolLM2 through flashrt")
    d.add_argument("prompt", nargs="?", default=None, help="what to ask (default: embedded)")
    args = parser.parse_args(argv)
    if args.command == "kernels":
        report = impls.kernels_report()
        if args.json:
            json.dump(report, sys.stdout, indent=2)
            print()
        else:
            print_kernels(report)
        return 0
    if args.command == "tune":
        return tune(args)
    from . import demo

    return demo.main(getattr(args, "prompt", None))


if __name__ == "__main__":
    sys.exit(main())
