#!/usr/bin/env bash
# The GPU suite in one short run on a machine with a CUDA device and no network (a lent GPU
# machine): installs nothing from the network, runs tests/gpu/ and writes what it found under
# the output folder, failures included. Docs: docs/gpu-suite.md.
#
#   tests/gpu/run.sh [--out DIR] [--sizes MIB,MIB] [--repeat N] [--quick] [PYTEST ARGS...]
#
#   --out DIR      where the files go (default: $OUT where the device tool sets it, else ./gpu-out)
#   --sizes        state sizes of the commit and restore measure, MiB (default 1024,8192)
#   --repeat N     timed repetitions of that measure (default 2)
#   --quick        1024 MiB only (a first look, about half the time)
#   PYTEST ARGS    passed on, e.g. -k nccl
#
# Wheels in .whl/ (tests/gpu/wheels.sh, here; SRES_GPU_WHEELS names another folder) are
# installed into a private folder first.
# Files written: env.txt (the machine), log.txt (pytest's output), junit.xml, figures.jsonl
# (one measured figure a line), nvml_*.json (the host's NVML reading: a unit-test fixture).
# Exit status: pytest's (0 all passed, 1 some failed, 5 nothing ran).
set -uo pipefail
cd "$(dirname "$0")/../.."

usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
out=${OUT:-$PWD/gpu-out}
sizes=1024,8192
repeat=2
pass=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h | --help) usage; exit 0 ;;
    --out) out=${2:?--out needs a folder}; shift 2 ;;
    --sizes)
      [[ ${2:-} =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "tests/gpu/run.sh: --sizes takes MiB, e.g. 1024,8192" >&2; exit 2; }
      sizes=$2; shift 2 ;;
    --repeat)
      [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || { echo "tests/gpu/run.sh: --repeat takes a count >= 1" >&2; exit 2; }
      repeat=$2; shift 2 ;;
    --quick) sizes=1024; shift ;;
    *) pass+=("$1"); shift ;;
  esac
done
mkdir -p "$out"
PYTHON=${PYTHON:-python3}

wheels=${SRES_GPU_WHEELS:-.whl}
if compgen -G "$wheels/*.whl" >/dev/null; then
  site=$(mktemp -d /tmp/sres-gpu-site.XXXXXX)
  "$PYTHON" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "$wheels"/*.whl \
    || { echo "tests/gpu/run.sh: the carried wheels did not install" | tee "$out/log.txt"; exit 3; }
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export SRES_GPU_OUT="$out" SRES_GPU_SIZES="$sizes" SRES_GPU_REPEAT="$repeat"

{
  date -u +%FT%TZ
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 || echo "no nvidia-smi"
  "$PYTHON" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "devices", torch.cuda.device_count())' 2>&1
  nproc; free -g | sed -n 2p; df -h /dev/shm /tmp | tail -n +2
} >"$out/env.txt"
cat "$out/env.txt"

# The suite's own conftest only (--confcutdir): no Slurm cluster, no lanes. Each test's
# timeout leaves the whole run inside 8 minutes on an H100 with the defaults.
# The most telling first: if the call runs out of time, what ran is in log.txt and figures.jsonl.
order=(tests/gpu/test_nccl.py tests/gpu/test_health.py tests/gpu/test_state_copies.py tests/gpu/test_fsdp_overhead.py)
for file in tests/gpu/test_*.py; do  # a test file added later runs too, last
  [[ " ${order[*]} " == *" $file "* ]] || order+=("$file")
done
"$PYTHON" -m pytest "${order[@]}" --confcutdir tests/gpu -p no:cacheprovider -o addopts= -rA -v \
  --timeout 300 --junitxml "$out/junit.xml" "${pass[@]}" 2>&1 | tee "$out/log.txt"
status=${PIPESTATUS[0]}
echo "tests/gpu/run.sh: pytest exit status $status; files in $out: $(ls "$out" | tr '\n' ' ')"
exit "$status"
