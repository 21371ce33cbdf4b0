"""python -m flashrt_structures [kernels [--json] | demo]"""

from __future__ import annotations

import argparse
import json
import sys

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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flashrt_structures")
    sub = parser.add_subparsers(dest="command")
    k = sub.add_parser("kernels", help="kernel packages, variants, the chosen one, and refusals")
    k.add_argument("--json", action="store_true", help="print the same as JSON")
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
    from . import demo

    return demo.main(getattr(args, "prompt", None))


if __name__ == "__main__":
    sys.exit(main())
