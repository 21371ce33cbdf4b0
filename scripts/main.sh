#!/usr/bin/env bash
# The main job on its embedded default: set up (idempotently), then run flashrt's demo.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh"
cd "$repo"
# transformers' GGUF loader shows a plain tqdm bar while it dequantises the file; tqdm reads its
# own switch, TQDM_DISABLE, when it is first imported (by `import torch`), so it is set here.
export TQDM_DISABLE=1
exec .venv/bin/python -m flashrt_structures demo "$@"
