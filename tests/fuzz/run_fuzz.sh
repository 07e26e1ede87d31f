#!/usr/bin/env bash
# Builds a libFuzzer target with clang into a temporary directory and fuzzes it for SECONDS (default 60):
# the .npy header parser (fuzz_npy_header, seeded with headers numpy writes, make_seeds.py, and the regression
# inputs), or with TARGET fuzz_zip_archive the .npz container (seeded with the hostile archive corpus).
#   tests/fuzz/run_fuzz.sh [SECONDS] [TARGET]
# Environment: NPYFEED_FUZZ_BUILD (build directory, default /tmp/npyfeed-fuzz), CXX (default clang++),
# NPYFEED_FUZZ_JOBS (build parallelism, default 2). A crash leaves its input in $NPYFEED_FUZZ_BUILD/artifacts/:
# copy it to tests/fuzz/regressions/ with the fix. Exit status: 0 when no finding, else libFuzzer's.
set -euo pipefail
seconds="${1:-60}"
target="${2:-fuzz_npy_header}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${NPYFEED_FUZZ_BUILD:-/tmp/npyfeed-fuzz}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNPYFEED_BUILD_PYTHON=OFF -DNPYFEED_BUILD_TESTS=OFF -DNPYFEED_BUILD_FUZZ=ON -DNPYFEED_SANITIZE= >/dev/null
cmake --build "$build" --target "$target" -j "${NPYFEED_FUZZ_JOBS:-2}" >/dev/null
fuzzer="$build/tests/fuzz/$target"

if [ "$target" = fuzz_zip_archive ]; then
  rm -rf "$build/zip-seeds" "$build/zip-artifacts" "$build/zip-corpus"
  mkdir -p "$build/zip-seeds" "$build/zip-artifacts" "$build/zip-corpus"
  python3 "$here/../corpus/make_npz_corpus.py" "$build/zip-seeds" >/dev/null
  status=0
  "$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -max_len=65536 -artifact_prefix="$build/zip-artifacts/" \
    "$build/zip-corpus" "$build/zip-seeds" >"$build/fuzz-zip.log" 2>&1 || status=$?
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz-zip.log")"
  findings="$(find "$build/zip-artifacts" -type f | wc -l)"
  echo "fuzz: ${runs:-?} executions in ${seconds} s, findings ${findings}"
  if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then tail -n 60 "$build/fuzz-zip.log"; exit 1; fi
  exit 0
fi

rm -rf "$build/seeds" "$build/artifacts"
mkdir -p "$build/corpus" "$build/artifacts"
python3 "$here/make_seeds.py" "$build/seeds"

# Every regression input must pass before new ones are searched for.
shopt -s nullglob
regressions=()
for f in "$here"/regressions/*; do [[ "$f" == *.md ]] || regressions+=("$f"); done
if [ "${#regressions[@]}" -gt 0 ]; then
  "$fuzzer" "${regressions[@]}" >"$build/regressions.log" 2>&1 || { cat "$build/regressions.log"; exit 1; }
  echo "fuzz: ${#regressions[@]} regression inputs pass"
fi

status=0
"$fuzzer" -max_total_time="$seconds" -print_final_stats=1 -dict="$here/npy_header.dict" -max_len=12288 \
  -artifact_prefix="$build/artifacts/" "$build/corpus" "$build/seeds" "$here/regressions" \
  >"$build/fuzz.log" 2>&1 || status=$?
runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$build/fuzz.log")"
rate="$(sed -n 's/^stat::average_exec_per_sec: *//p' "$build/fuzz.log")"
corpus="$(find "$build/corpus" -type f | wc -l)"
findings="$(find "$build/artifacts" -type f | wc -l)"
echo "fuzz: ${runs:-?} executions in ${seconds} s (${rate:-?}/s), corpus ${corpus} inputs, findings ${findings}"
if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
  tail -n 60 "$build/fuzz.log"
  ls -l "$build/artifacts"
  exit $(( status != 0 ? status : 1 ))
fi
