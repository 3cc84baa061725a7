#!/bin/bash
#SBATCH --job-name=habitat_ddppo-train
#SBATCH --array=1-3%3
#SBATCH --output=/scratch/hpcrl/habitat_ddppo/jobs/logs/train-%A_%a.out
#SBATCH --open-mode=append
#SBATCH --nodes=1
#SBATCH --ntasks-per-node=4
#SBATCH --cpus-per-task=4
#SBATCH --mem=65536M
#SBATCH --time=48:00:00
#SBATCH --gres=gpu:4
#SBATCH --requeue
#SBATCH --signal=B:USR1@600
# hpcrl train job for experiment habitat_ddppo, rendered by hpcrl 0.1.0.
set -uo pipefail

TASK_ID="${SLURM_ARRAY_TASK_ID:-0}"
# Put the CUDA libraries on the library path unless the site already did.
case ":${LD_LIBRARY_PATH:-}:" in
  *:/opt/cuda-9.2/lib64:*) ;;
  *) export LD_LIBRARY_PATH=/opt/cuda-9.2/lib64"${LD_LIBRARY_PATH:+:${LD_LIBRARY_PATH}}" ;;
esac
export SINGULARITYENV_MAGNUM_LOG=quiet
export APPTAINERENV_MAGNUM_LOG=quiet
export SINGULARITYENV_GLOG_minloglevel=2
export APPTAINERENV_GLOG_minloglevel=2
HPCRL=(singularity exec --nv --bind /work:/work --bind /storage:/storage --bind /scratch/hpcrl/habitat_ddppo --bind /opt/cuda-9.2/lib64:/opt/cuda-9.2/lib64:ro --home /work/home /images/habitat.sif hpcrl)

# DD-PPO: srun starts 4 ranks (4 per node, each reads SLURM_PROCID and
# SLURM_NTASKS). Rank 0 runs on the allocation's first node, opens the rendezvous store there on a
# port the kernel picks, and publishes it in the run directory under this start's launch id.
# srun passes the warning signal to every rank, and ends the step when one rank dies.
export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"
export HPCRL_LAUNCH_ID="${SLURM_JOB_ID}.${SLURM_RESTART_COUNT:-0}"
# The work runs in the background so that this shell can catch the scheduler's warning signal
# and pass it on: hpcrl then checkpoints and exits with 99 to ask for a requeue.
# The trap comes first: a warning (Grid Engine's USR1 or USR2, which reach every process of the
# job, a repeated scancel --signal) must never end this shell, whenever it comes.
child=
trap '[ -n "$child" ] && kill -USR1 "$child" 2>/dev/null' USR1 USR2 TERM
# srun starts the ranks, each an hpcrl: the status this script needs is srun's, which none of them leaves.
unset HPCRL_EXIT_FILE
printf -v HPCRL_STARTED '%(%s)T' -1  # the job's start, for the step after a failed one below (a builtin: bash >= 4.2)
HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" SINGULARITYENV_HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" APPTAINERENV_HPCRL_STEP_MARK="$HPCRL_LAUNCH_ID" srun --kill-on-bad-exit=1 --nodes=1 --ntasks=4 --ntasks-per-node=4 --cpus-per-task=4 "${HPCRL[@]}" train /scratch/hpcrl/habitat_ddppo --manifest jobs/0-0.tasks --task "$TASK_ID" &
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
if [ "$status" -ne 0 ] && [ "$status" -ne 99 ]; then
  # A rank killed alone (the OOM killer) leaves what its env started, where Slurm's proctrack/linuxproc or /pgid
  # loses it (reparented to init, or in a group of its own), and what that held in the node's /dev/shm. Every
  # process below a rank carries HPCRL_STEP_MARK (set on the ranks' srun above): one task on each node ends them
  # there, named in this log (bounded: a node that is gone holds nothing up).
  timeout -k 10 120 srun --overlap --kill-on-bad-exit=0 --nodes=1 --ntasks=1 --ntasks-per-node=1 --cpus-per-task=1 "${HPCRL[@]}" end-leftovers --mark "$HPCRL_LAUNCH_ID" --since "$HPCRL_STARTED" --status "$status" < /dev/null || true
fi
# scancel's SIGTERM also makes the trainer checkpoint and exit 99, and Slurm would requeue
# even a cancelled job: requeue only a task that Slurm still counts as running.
if [ "$status" -eq 99 ] && [ -n "${SLURM_ARRAY_JOB_ID:-}" ] &&
   [ "$(squeue -h -j "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" -o %T 2>/dev/null)" = RUNNING ]; then
  echo "hpcrl: checkpoint written; requeueing ${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" >&2
  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" && exit 0
fi
exit "$status"
