#!/usr/bin/env bash
# The main job on its embedded default: set up (idempotently), then run flashrt's demo.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh"
cd "$repo"
exec .venv/bin/python -m flashrt_structures demo "$@"
