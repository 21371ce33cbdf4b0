"""Fails when a structure, scheme or activation name appears in the planner's or the gates' code:
those facts live in catalog/ (and activation names in the core's one name table), so code that
spells them is a second home for them. Test files are exempt (they assert behaviour on names)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

repo = Path(__file__).resolve().parent.parent
catalog = repo / "catalog"
names = {p.stem for p in (catalog / "structures").glob("*.yaml")}
names |= set(yaml.safe_load((catalog / "schemes.yaml").read_text())["schemes"])
table = (repo / "core/src/runtime/types.cpp").read_text()
names |= set(re.findall(r"\{Activation::\w+, \"(\w+)\"\}", table))
names.discard("unknown")  # the activation table's 'no match' entry is an ordinary word

bad = []
for area in ("core/src/planner", "core/src/gates"):
    for path in sorted((repo / area).glob("*")):
        if path.name.endswith("_test.cpp") or path.suffix not in (".cpp", ".h"):
            continue
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            for name in names:
                if re.search(rf"\b{re.escape(name)}\b", line):
                    bad.append(f"{path.relative_to(repo)}:{lineno}: '{name}': {line.strip()}")
if bad:
    print("catalog names spelled in planner/gates code (they belong in catalog/):")
    print("\n".join(bad))
    sys.exit(1)
print(f"catalog names: none of {len(names)} appear in core/src/planner or core/src/gates")
