#!/usr/bin/env bash
# Builds the libFuzzer target with clang into a temporary directory and fuzzes the .npy header parser
# for SECONDS (default 60), seeded with headers numpy writes (make_seeds.py) and the regression inputs.
#   tests/fuzz/run_fuzz.sh [SECONDS]
# Environment: NPYFEED_FUZZ_BUILD (build directory, default /tmp/npyfeed-fuzz), CXX (default clang++),
# NPYFEED_FUZZ_JOBS (build parallelism, default 2). A crash leaves its input in $NPYFEED_FUZZ_BUILD/artifacts/:
# copy it to tests/fuzz/regressions/ with the fix. Exit status: 0 when no finding, else libFuzzer's.
set -euo pipefail
seconds="${1:-60}"
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
build="${NPYFEED_FUZZ_BUILD:-/tmp/npyfeed-fuzz}"
generator=()
command -v ninja >/dev/null 2>&1 && generator=(-G Ninja)

cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_CXX_COMPILER="${CXX:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DNPYFEED_BUILD_PYTHON=OFF -DNPYFEED_BUILD_TESTS=OFF -DNPYFEED_BUILD_FUZZ=ON -DNPYFEED_SANITIZE= >/dev/null
cmake --build "$build" --target fuzz_npy_header -j "${NPYFEED_FUZZ_JOBS:-2}" >/dev/null
fuzzer="$build/tests/fuzz/fuzz_npy_header"

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
