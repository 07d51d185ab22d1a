#!/usr/bin/env bash
# A/B of compile-time variants in one call on a GPU machine. Builds every extension module once
# (the base tree), then for each variant the listed MODULES again with its extra flags (CUDA and
# C++ sources both get them; the source must honour them, e.g. a temporary #if), assembles one
# package per variant (the base modules plus the variant's), and times CASES under every variant
# for ROUNDS rounds, the order reversed in every other round. Prints one table
# (scripts/sweep_table.py); logs under $OUT/ab.
# A variant line may name its own modules in a third field ("label|flags|_norm _rope"); a variant
# whose modules are " " (a blank third field that is not empty) uses the base build's modules.
# EXTRA_CONFIGS adds sweep configs as they are ("label|PYTHONPATH=/a/package/built/elsewhere").
#   VARIANTS=$'head|\nplain|-DFLASHINFER_EXP_X=0' MODULES="_norm _rope" \
#     CASES=benchmarks/dev_cases_norm.txt ROUNDS=2 bash scripts/gpu_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
A=$OUT/ab
mkdir -p "$A"
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
: "${VARIANTS:?VARIANTS: lines of label|cuda flags}" "${MODULES:?MODULES: the modules a variant rebuilds}"
: "${CASES:?CASES: a bench testlist}"
ALL="_cuda _norm _activation _decode _cascade _rope _page _prefill _sampling"
t0=$(date +%s)
configure() {  # build dir, extra CUDA flags
  cmake -S . -B "$1" -G Ninja -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF \
    -DPython_EXECUTABLE="$(command -v python3)" -DCMAKE_CUDA_FLAGS="$2" -DCMAKE_CXX_FLAGS="$2" > "$A/configure-$(basename "$1").log" 2>&1
}
configure build/ab-base "" &
labels=()
i=0
mods=()
while IFS='|' read -r label flags vmods; do
  [ -z "$label" ] && continue
  i=$((i + 1))
  labels+=("$label")
  mods+=("${vmods:-$MODULES}")
  configure "build/ab-$i" "$flags" &
done <<< "$VARIANTS"
wait  # the configures run side by side
for d in build/ab-base $(seq -f "build/ab-%g" 1 $i); do
  [ -f "$d/build.ninja" ] || { echo "configure of $d failed"; exit 1; }
done
# the base gets half the cores, the variants share the rest
cmake --build build/ab-base -j "$(( $(nproc) / 2 + 1 ))" --target $ALL > "$A/build-base.log" 2>&1 &
for j in $(seq 1 $i); do
  [ -n "$(echo ${mods[$((j - 1))]})" ] && cmake --build "build/ab-$j" -j "$(( $(nproc) / i + 1 ))" --target ${mods[$((j - 1))]} > "$A/build-$j.log" 2>&1 &
done
wait
echo "builds: $(( $(date +%s) - t0 )) s"
if grep -l "error:" "$A"/build-*.log; then exit 1; fi
configs=""
for j in $(seq 1 $i); do
  P=$PWD/build/ab-pkg-$j
  rm -rf "$P" && mkdir -p "$P" && cp -r python/flashinfer "$P/" && cp build/ab-base/bindings/*.so "$P/flashinfer/"
  for m in ${mods[$((j - 1))]}; do cp "build/ab-$j/bindings/$m".*.so "$P/flashinfer/"; done
  configs+="${labels[$((j - 1))]}|PYTHONPATH=$P"$'\n'
done
configs+="${EXTRA_CONFIGS:-}"
rounds=()
for r in $(seq 1 "${ROUNDS:-2}"); do
  c="$configs"
  [ $((r % 2)) -eq 0 ] && c="$(printf '%s' "$configs" | tac)"
  TAG=ab/r$r CONFIGS="$c" bash scripts/gpu_sweep.sh > "$A/round$r.txt" 2>&1
  rounds+=("$A/round$r.txt")
done
echo "total: $(( $(date +%s) - t0 )) s"
python3 scripts/sweep_table.py "${rounds[@]}"
