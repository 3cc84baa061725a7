#!/usr/bin/env bash
# The checks only a GPU node can make (issue 26), as one bounded script for a lent machine:
#   benchmarks/gpu_node.sh OUT_DIR
# Every step runs in its own process group under `timeout -s KILL`, which ends the group (env workers keep pipes
# open, so a hung step must not eat the budget), writes its log to OUT_DIR, and the script goes on to the next.
# The CUDA-only tests, DQN on CUDA, two ranks on one GPU, and 64 ViZDoom envs starting at once run
# side by side; the speed measurement runs last, alone (SKIP_SPEED=1 leaves it out). OUT_DIR/summary.txt
# has one line per step.
# With .devbundle/bundle.tar.xz carried (benchmarks/device_bundle.sh, made where pip reaches the registries), it
# also measures ViZDoom beside Sample Factory at 32 and 64 envs (issue 39's GPU half), each side on its own
# packages: hpcrl's gymnasium and ViZDoom on PYTHONPATH, Sample Factory's through a wrapper
# (HPCRL_BENCH_PYTHON_SAMPLE_FACTORY). SF_ONLY=1 runs that alone (a call's 10 minutes hold it and a start).
# For a try on a CPU: DEVICE (cuda), SF_ENVS (32 64), SF_SECONDS (10), SF_SIDES (random hpcrl-async
# sample-factory) and BUNDLE (the bundle's path) change it (tests/test_benchmarks.py).
set -u
out=${1:?usage: benchmarks/gpu_node.sh OUT_DIR}
# The steps are command lines (`bash -c`), and these values are words in them (SF_ENVS="32 64" is two): a line
# break or a `;` would run as a command of its own. Refused in one line before anything is made.
for var in DEVICE SF_ENVS SF_SECONDS SF_SIDES; do
  [[ ${!var-} =~ ^[A-Za-z0-9\ ._:-]*$ ]] || { echo "gpu_node.sh: $var takes words of letters, digits and . _ : - (got ${!var@Q})" >&2; exit 2; }
done
for value in "$out" "${PYTHON-}"; do
  [[ $value =~ ^[A-Za-z0-9/._+-]*$ ]] || { echo "gpu_node.sh: ${value@Q}: a path of letters, digits and / . _ + - only" >&2; exit 2; }
done
# Stopped (TERM, INT: a lent machine's time running out), it ends every step it started, whole, then itself; bash
# would run the EXIT trap below for neither without a trap of their own. TERM first (a step's timeout passes it to its
# group), so that the games remove their shared memory as they end (killed at once, they left it in /dev/shm); then,
# after 10 s, KILL for whatever is left.
# In a trap, `$(...)` is a subshell that is itself this script's child: `steps` leaves it out, so that the wait below
# ends when the steps do (listing it, the wait ran its whole 10 s).
steps() { local me=$BASHPID; pgrep -P $$ | grep -vx "$me"; }
end_tree() { local child; for child in $(pgrep -P "$1"); do end_tree "$child"; done; kill -KILL "$1" 2>/dev/null; }
stop() {
  local child
  for child in $(steps); do kill -TERM "$child" 2>/dev/null; done
  for _ in {1..40}; do [ -z "$(steps)" ] && break; sleep 0.25; done
  for child in $(steps); do end_tree "$child"; done
  exit "$1"
}
trap 'stop 143' TERM
trap 'stop 130' INT
mkdir -p "$out"
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg
py=${PYTHON:-python3}
hp="$py -m hpcrl"
logs=$(mktemp -d)  # the steps' experiments and the unpacked bundle: what a step shows is in its log under OUT_DIR
trap 'rm -rf "$logs"' EXIT  # and on TERM and INT, whose traps exit; a kill -9 leaves it, in the machine's /tmp

step() {  # step NAME SECONDS CMD...: run CMD in a process group of its own (timeout's), killed with it after SECONDS
  local name=$1 secs=$2; shift 2
  local t0=$SECONDS
  # Not under setsid: timeout kills its own group, and a session of the command's own took the command's children
  # out of it (a timed-out step's processes lived on). Waited for in the background, so that TERM is handled at once.
  timeout -s KILL "$secs" bash -c "$*" >"$out/$name.log" 2>&1 &
  wait $!
  local rc=$?
  echo "$name rc=$rc $((SECONDS - t0))s" >>"$out/summary.txt"
}

sf_side=
bundle=${BUNDLE:-.devbundle/bundle.tar.xz}
if [ -f "$bundle" ] && ! tar -C "$logs" -xJf "$bundle" 2>"$out/bundle.log"; then
  echo "bundle rc=1: $bundle does not unpack (bundle.log); Sample Factory's side left out" >>"$out/summary.txt"
elif [ -f "$bundle" ]; then
  export PYTHONPATH="$logs/bundle/common:$logs/bundle/hpcrl${PYTHONPATH:+:$PYTHONPATH}"
  printf '#!/bin/sh\nPYTHONPATH=%s exec %s "$@"\n' "$logs/bundle/sf:$logs/bundle/common" "$(command -v "$py")" >"$logs/sf-python"
  chmod +x "$logs/sf-python"
  export HPCRL_BENCH_PYTHON_SAMPLE_FACTORY="$logs/sf-python"
  sf_side=sample-factory
elif [ -n "${SF_ONLY:-}" ]; then
  echo "bundle rc=1: no $bundle (benchmarks/device_bundle.sh makes it): SF_ONLY=1 has nothing to run" >>"$out/summary.txt"
fi

{ nvidia-smi -L; $py -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0))'; nproc; } >"$out/facts.txt" 2>&1

if [ -z "${SF_ONLY:-}" ]; then
  step cuda_tests 240 "$py -m pytest -q -p no:cacheprovider -n 0 tests/rl/test_graphs.py tests/rl/test_networks.py tests/rl/test_optim.py tests/rl/test_periodic_eval.py -k 'cuda or amp or fp16 or bf16 or graph or noise'" &
  step dqn_cuda 300 "$hp sweep configs/cartpole_dqn.yaml -p output=$logs -p train.device=cuda -p resources.gpus=1 -p train.total_steps=30000 -p 'sweep.seeds=[0]' --name dqn_cuda && $hp collect $logs/dqn_cuda && cat $logs/dqn_cuda/results/summary.csv; $hp sweep configs/vizdoom_dqn.yaml -p output=$logs -p train.device=cuda -p resources.gpus=1 -p train.total_steps=6000 -p 'sweep.seeds=[0]' --name vizdoom_dqn_cuda && tail -n 2 $logs/vizdoom_dqn_cuda/runs/*/train.csv" &
  step ranks_one_gpu 200 "$hp sweep configs/cartpole_ppo.yaml -p output=$logs -p train.device=cuda -p resources.ranks=2 -p train.total_steps=8192 -p 'sweep.seeds=[0]' --name ranks2; echo rc=\$?; $hp sweep configs/cartpole_ppo.yaml -p output=$logs -p train.device=cuda -p resources.ranks=2 -p resources.gpus=2 -p train.total_steps=8192 -p 'sweep.seeds=[0]' --name ranks2g; echo rc=\$?; cat $logs/ranks2*/runs/*/FAILED 2>/dev/null; tail -n 5 $logs/ranks2*/runs/*/*.log 2>/dev/null | tail -n 40"
  wait
  [ -n "${SKIP_SPEED:-}" ] || step speed 300 "$py benchmarks/vizdoom_speed.py --device cuda --num-envs 8 32 64 --sides random hpcrl-async --seconds 10 --timeout 90 --out $out/speed"
  [ -n "${SKIP_SPEED:-}" ] || step speed_eager 120 "$py benchmarks/vizdoom_speed.py --device cuda --num-envs 8 --sides hpcrl-async -p train.cuda_graph=false --seconds 10 --timeout 90 --out $out/eager"
fi
[ -z "$sf_side" ] || step speed_sf 420 "$py benchmarks/vizdoom_speed.py --device ${DEVICE:-cuda} --num-envs ${SF_ENVS:-32 64} --sides ${SF_SIDES:-random hpcrl-async sample-factory} --seconds ${SF_SECONDS:-10} --timeout 120 --out $out/speed_sf"
cat "$out/summary.txt"
