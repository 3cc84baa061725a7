#!/bin/bash
#$ -N habitat_ddppo-aggregate
#$ -S /bin/bash
#$ -cwd
#$ -j y
#$ -o /scratch/hpcrl/habitat_ddppo/jobs/logs/aggregate-$JOB_ID.out
#$ -l h_rt=00:30:00
#$ -l mem_free=2048M
# hpcrl aggregate job for experiment habitat_ddppo, rendered by hpcrl 0.1.0.
set -uo pipefail

TASK_ID="${SGE_TASK_ID:-0}"
[ "$TASK_ID" = "undefined" ] && TASK_ID=0
# Put the CUDA libraries on the library path unless the site already did.
case ":${LD_LIBRARY_PATH:-}:" in
  *:/opt/cuda-9.2/lib64:*) ;;
  *) export LD_LIBRARY_PATH=/opt/cuda-9.2/lib64"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;;
esac
export SINGULARITYENV_MAGNUM_LOG=quiet
export APPTAINERENV_MAGNUM_LOG=quiet
export SINGULARITYENV_GLOG_minloglevel=2
export APPTAINERENV_GLOG_minloglevel=2
HPCRL=(singularity exec --bind /work:/work --bind /storage:/storage --bind /scratch/hpcrl/habitat_ddppo --bind /opt/cuda-9.2/lib64:/opt/cuda-9.2/lib64:ro --home /work/home /images/habitat.sif hpcrl)

# The work runs in the background so that this shell can pass a stop signal (TERM) on to it and
# exit with its status; this stage asks for no warning signal and is not requeued.
child=
trap '[ -n "$child" ] && kill -USR1 "$child" 2>/dev/null' USR1 USR2 TERM
# hpcrl leaves its exit status in this file as it exits: a signal that cuts the `wait` below short can
# leave bash without the child's status (it then says 128+N, or loses it: 255).
export HPCRL_EXIT_FILE=/scratch/hpcrl/habitat_ddppo/jobs/logs/.exit-"$HOSTNAME"-$$
printf -v HPCRL_STARTED '%(%s)T' -1  # the job's start, for the last step below (a builtin: bash >= 4.2)
export SINGULARITYENV_HPCRL_EXIT_FILE="$HPCRL_EXIT_FILE" APPTAINERENV_HPCRL_EXIT_FILE="$HPCRL_EXIT_FILE"
rm -f "$HPCRL_EXIT_FILE"
"${HPCRL[@]}" collect /scratch/hpcrl/habitat_ddppo &
child=$!
while :; do
  wait "$child"
  status=$?
  kill -0 "$child" 2>/dev/null || break
done
# The child is gone: nothing is left to pass a warning to, and one must not cut the read below short.
trap '' USR1 USR2 TERM
if [ -n "${HPCRL_EXIT_FILE:-}" ]; then
  left=
  read -r left 2>/dev/null < "$HPCRL_EXIT_FILE"  # 2> first: a missing file (the child was killed) says nothing
  case "$left" in ''|*[!0-9]*) ;; *) status=$left ;; esac
  if [ -z "$left" ] && [ "$status" -gt 128 ] && [ "$status" -lt 255 ]; then
    # hpcrl was killed (the OOM killer, a SIGKILL) before it could end what its envs started: a ViZDoom engine
    # whose env worker died with it lives on where the scheduler lost track of it, and what it held in /dev/shm
    # stays in the node's memory. This step ends them and removes those files, named in this log.
    "${HPCRL[@]}" end-leftovers --since "$HPCRL_STARTED" --status "$status" < /dev/null || true
  fi
  rm -f "$HPCRL_EXIT_FILE"  # after that step, which leaves its own status there
fi
exit "$status"
