#!/usr/bin/env bash
# The SGLang door's environment, idempotently: .venv-sglang, with torch 2.13.0 (CPU) first, then
# sglang 0.5.23 without its dependencies (its metadata pins torch 2.14.1 and CUDA-only packages:
# sglang-kernel, flashinfer, ...; PyPI has no CPU build of sgl-kernel), then the packages its CPU
# path imports (scripts/sglang-requirements.txt, --no-deps: one pinned set), then the test
# environment's stand-ins, then flashrt_structures built into its own build folder.
#
# Stand-ins (python/tests_sglang/standins, on the path through a .pth file in this environment
# only): SGLang imports `sgl_kernel` and `torchvision` at module level on its CPU path and calls
# neither on the torch-native path. PyPI's sgl-kernel and torchvision are CUDA builds (torchvision's
# breaks CPU torch's imports), so the environment has stand-ins whose every function raises and is
# recorded; the SGLang tests fail if one is ever called.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$repo"
venv=.venv-sglang

python=${PYTHON:-python3}
if [ ! -x "$venv/bin/python" ]; then
  echo "[setup-sglang] creating $venv"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)

if ! "$venv/bin/python" -c "import torch, sys; sys.exit(torch.__version__.split('+')[0] != '2.13.0')" 2>/dev/null; then
  echo "[setup-sglang] installing torch 2.13.0"
  "${pip[@]}" install torch==2.13.0
fi

stamp=$venv/.flashrt-requirements
want="sglang==0.5.23 $(sha256sum scripts/sglang-requirements.txt | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup-sglang] installing sglang 0.5.23 and the packages its CPU path imports"
  "${pip[@]}" install --no-deps sglang==0.5.23 -r scripts/sglang-requirements.txt
  echo "$want" > "$stamp"
fi
for p in torchvision torchaudio torchcodec sgl-kernel sglang-kernel; do
  if "$venv/bin/python" -m pip show -q "$p" >/dev/null 2>&1; then
    echo "[setup-sglang] removing $p (a CUDA build; the stand-in takes its place)"
    "${pip[@]}" uninstall -y "$p"
  fi
done

site=$("$venv/bin/python" -c "import sysconfig; print(sysconfig.get_paths()['purelib'])")
printf '%s\nimport _standin; _standin.install()\n' "$repo/python/tests_sglang/standins" \
  > "$site/flashrt_standins.pth"

echo "[setup-sglang] building flashrt_structures into $venv (incremental in build/sglang-py)"
PATH="$repo/$venv/bin:$PATH" "${pip[@]}" install --no-build-isolation --no-deps \
  -C build-dir=build/sglang-py .
