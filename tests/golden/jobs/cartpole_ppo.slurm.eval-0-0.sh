#!/bin/bash
#SBATCH --job-name=cartpole_ppo-eval
#SBATCH --array=1-3
#SBATCH --output=/scratch/hpcrl/cartpole_ppo/jobs/logs/eval-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --cpus-per-task=1
#SBATCH --mem=2048M
#SBATCH --time=00:30:00
# hpcrl eval job for experiment cartpole_ppo, rendered by hpcrl 0.1.0.
set -uo pipefail

TASK_ID="${SLURM_ARRAY_TASK_ID:-0}"
HPCRL=(/opt/venv/bin/python -m hpcrl)

# The work runs in the background so that this shell can pass a stop signal (TERM) on to it and
# exit with its status; this stage asks for no warning signal and is not requeued.
child=
trap '[ -n "$child" ] && kill -USR1 "$child" 2>/dev/null' USR1 USR2 TERM
# hpcrl leaves its exit status in this file as it exits: a signal that cuts the `wait` below short can
# leave bash without the child's status (it then says 128+N, or loses it: 255).
export HPCRL_EXIT_FILE=/scratch/hpcrl/cartpole_ppo/jobs/logs/.exit-"$HOSTNAME"-$$
printf -v HPCRL_STARTED '%(%s)T' -1  # the job's start, for the last step below (a builtin: bash >= 4.2)
rm -f "$HPCRL_EXIT_FILE"
"${HPCRL[@]}" eval /scratch/hpcrl/cartpole_ppo --manifest jobs/0-0.tasks --task "$TASK_ID" &
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
