#!/usr/bin/env bash
# Runs the whole test suite. Installs what is missing first:
#   Debian packages: slurm-wlm slurm-client munge libslurm-dev openssh-server gcc chromium iproute2
#   slurmdbd mariadb-server mariadb-client-core (root)
#   Python: torch==2.13.0 (the CPU build; skipped if torch is importable), this package + test extras
# Extra arguments go to pytest, e.g. ./tests/run.sh tests/unit -x; --all runs the slow tests too;
# --store-durations records each test's time into tests/durations.json, which balances the lanes
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
export PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1

say() { printf 'tests/run.sh: %s\n' "$*"; }

# --- Debian packages: install only what is missing ----------------------------------------
missing=()
command -v slurmctld >/dev/null || missing+=(slurm-wlm)
command -v slurmd >/dev/null || missing+=(slurm-wlm)
command -v scontrol >/dev/null || missing+=(slurm-client)
command -v munged >/dev/null || missing+=(munge)
[ -f /usr/include/slurm/spank.h ] || missing+=(libslurm-dev)
[ -x /usr/sbin/sshd ] || missing+=(openssh-server)
command -v ip >/dev/null || missing+=(iproute2)  # the network tests' namespaces, links and their faults
command -v tc >/dev/null || missing+=(iproute2)
command -v cc >/dev/null || missing+=(gcc)  # builds the SPANK plugin against spank.h
command -v chromium >/dev/null || missing+=(chromium)  # renders sres report's page in a real browser
command -v slurmdbd >/dev/null || missing+=(slurmdbd)  # accounting for the governance tests, on MariaDB:
command -v mariadbd >/dev/null || missing+=(mariadb-server)  # started by the tests, never the system's
command -v my_print_defaults >/dev/null || missing+=(mariadb-client-core)
if [ ${#missing[@]} -gt 0 ]; then
  pkgs=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
  if [ "$(id -u)" -ne 0 ]; then
    say "missing Debian packages: $pkgs; run as root, or: sudo apt-get install -y $pkgs"
    exit 1
  fi
  say "installing $pkgs"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
fi

# --- Python packages -----------------------------------------------------------------------
if ! "$PYTHON" -c 'import torch' 2>/dev/null; then
  say "installing torch==2.13.0 (CPU build)"
  "$PYTHON" -m pip install -q torch==2.13.0
fi
say "installing slurm-resilience[test]"
"$PYTHON" -m pip install -q -e '.[test]'

# The CI set by default; --all adds the soak-length runs (-m slow). Two lanes side by side: one
# holds the Slurm tests, and the others are spread over both by their measured times
# (tests/support/lanes.py). SRES_TEST_LANES=1 runs everything in this one process.
select=(-m "not slow")
lanes=()
[ "${SRES_TEST_LANES:-2}" = 1 ] || lanes=(-n 2 --dist loadgroup)
args=()
for arg in "$@"; do
  if [ "$arg" = "--all" ]; then select=(); else args+=("$arg"); fi
done
say "running pytest ${select[*]:-(all tests)} ${lanes[*]}"
exec "$PYTHON" -m pytest --durations=40 "${select[@]}" "${lanes[@]}" "${args[@]}"
