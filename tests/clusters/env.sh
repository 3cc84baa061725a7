# shellcheck shell=bash
# Source this (`source tests/clusters/env.sh`) before using the test clusters started by slurm.sh / sge.sh.
#
# Why it exists: Grid Engine's clients (qsub, qstat, qacct, qconf) find their cell only through SGE_ROOT and
# SGE_CELL. Debian installs those clients in /usr/bin, so PATH needs no addition; Slurm's clients need nothing
# at all (they read /etc/slurm/slurm.conf).
# No `set -euo pipefail` here on purpose: this file is sourced into the caller's shell.

export SGE_ROOT=/var/lib/gridengine
export SGE_CELL=default
