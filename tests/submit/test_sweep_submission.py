"""`hpcrl sweep` as a submitter (issue 12): one sweep per experiment at a time, which scheduler `auto`
chose and why, no half-written experiment when the scheduler refuses the first job, damaged job
records as one line, per-stage resources in jobs.json, eval-only retries, and task i running the
run on manifest line i on every backend."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from factories import write_config

from hpcrl.config.load import load_experiment
from hpcrl.schedulers import detect_with_reason, get_scheduler
from hpcrl.schedulers.base import NodeRequest, SchedulerError
from hpcrl.schedulers.sge import complex_value, host_slots, offered
from hpcrl.schedulers.slurm import gres_gpus
from hpcrl.status import cancel_experiment
from hpcrl.store import rundir
from hpcrl.store.expdir import load_runs, merge_runs, read_jobs, run_dir, write_experiment
from hpcrl.submit.jobplan import node_requests, stage_resources
from hpcrl.submit.pipeline import plan_scripts, submit_experiment
from hpcrl.sweep.runs import expand

PY = sys.executable
CONFORMANCE = Path(__file__).resolve().parents[1] / "data" / "conformance.yaml"


def hpcrl(*args: str, cwd: Path, env: dict | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "hpcrl", *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=timeout)


def standin(directory: Path, name: str, body: str) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / name
    path.write_text("#!/bin/bash\n" + body)
    path.chmod(0o755)
    return path


# ------------------------------------------------------------------------------------ item 5


def test_two_sweeps_of_one_experiment_at_once_one_refuses(tmp_path: Path) -> None:
    """Two real `hpcrl sweep` processes: the second starts while the first is submitting (the stand-in sbatch
    holds its first call until the second has ended, and no later one). The second refuses in one line (exit 1);
    jobs.json holds the first one's jobs, and sbatch was called for them only. (Both started at once, as before,
    the first could finish its three submissions before a second slowed by the suite's load reached the lock: a
    re-sweep then, exit 0, not a refusal; it failed so once in the unit tier here.)"""
    bin_dir = tmp_path / "bin"
    calls, inside, go = tmp_path / "sbatch-calls", tmp_path / "inside", tmp_path / "go"
    standin(bin_dir, "sbatch", f'echo "$@" >> {calls}\nif [ ! -e {go} ] && [ ! -e {inside} ]; then touch {inside}; for _ in $(seq 1200); do [ -e {go} ] && break; sleep 0.1; done; fi\nwc -l < {calls}\n')
    config = write_config(tmp_path)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    command = [PY, "-m", "hpcrl", "sweep", str(config), "--scheduler", "slurm"]
    with subprocess.Popen(command, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as first:
        try:
            deadline = time.monotonic() + 120
            while not inside.exists():
                assert first.poll() is None and time.monotonic() < deadline, f"the first sweep never reached sbatch: {first.poll()} {first.stderr.read() if first.poll() is not None else ''}"
                time.sleep(0.05)
            second = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
        finally:
            go.touch()
        out, err = first.communicate(timeout=120)
    assert first.returncode == 0, (out, err)
    assert second.returncode == 1, (second.stdout, second.stderr)
    assert second.stderr.count("\n") == 1 and "another `hpcrl sweep` of this experiment" in second.stderr and "Traceback" not in second.stderr
    jobs = read_jobs(tmp_path / "logs" / "tiny")
    assert [j.stage for j in jobs] == ["train", "eval", "aggregate"]
    assert len(calls.read_text().splitlines()) == 3


# ------------------------------------------------------------------------------------ item 20


@pytest.mark.parametrize("tools,expected", [(("sbatch", "qsub"), "slurm"), (("qsub",), "sge"), ((), "local")])
def test_auto_detection_follows_path_and_says_why(tools: tuple[str, ...], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in tools:
        standin(bin_dir, tool, "exit 0\n")
    monkeypatch.setenv("PATH", str(bin_dir))
    name, why = detect_with_reason()
    assert name == expected and "--scheduler" in why
    assert (tools[0] in why) if tools else ("neither sbatch nor qsub" in why)


def test_sweep_prints_which_scheduler_auto_chose(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    standin(bin_dir, "sbatch", "exit 0\n")
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}  # the unit tier's stand-ins for sinfo & co. stay in front of the machine's
    proc = hpcrl("sweep", str(write_config(tmp_path)), "--dry-run", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert f"hpcrl: --scheduler auto chose slurm: sbatch is on PATH ({bin_dir}/sbatch)" in proc.stderr
    assert "#SBATCH" in proc.stdout


@pytest.mark.slurm
def test_a_refused_first_submission_leaves_no_experiment(slurm_cluster: None, tmp_path: Path) -> None:
    """Real Slurm refuses a partition that does not exist: nothing of the experiment stays on disk."""
    exp = load_experiment(CONFORMANCE, [f"output={tmp_path}", "resources.partition=no-such-partition"])
    with pytest.raises(SchedulerError, match="invalid partition"):
        submit_experiment(exp, "slurm", out=io.StringIO())
    assert not exp.dir.exists()


@pytest.mark.slurm
@pytest.mark.parametrize("override,message", [
    ("resources.cpus=3", r"resources.cpus: 3 CPUs per node, but the largest node of Slurm's default partition debug has 2 \(sinfo\)"),
    ("resources.mem=9999G", r"resources.mem: 9999G per node, but the largest node of Slurm's default partition debug has \d+M \(sinfo\)"),
])
def test_a_request_no_node_of_the_partition_can_hold_is_refused_before_anything_is_submitted(slurm_cluster: None, tmp_path: Path, override: str, message: str) -> None:
    """sbatch takes a job bigger than every node and Slurm keeps it pending for ever (PartitionConfig):
    the sweep refuses it in one line, exit 2, with nothing written or queued. The test node has 2 CPUs."""
    proc = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "slurm", "-p", f"output={tmp_path}", "-p", override, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert re.fullmatch(f"hpcrl: error: {message}: the job would stay pending for ever\n", proc.stderr), proc.stderr
    assert list(tmp_path.iterdir()) == []  # no experiment directory: its jobs.json would name a submitted job
    fits = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "slurm", "--dry-run", "-p", f"output={tmp_path}", "-p", "resources.cpus=2", cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr


@pytest.mark.slurm
@pytest.mark.parametrize("override", ["resources.gpus=3", "eval.gpus=3"])
def test_more_gpus_than_any_node_has_are_refused_before_anything_is_submitted(slurm_cluster: None, tmp_path: Path, override: str) -> None:
    """sbatch refuses `--gres=gpu:3` on the test node's 2 GPUs, but only when that stage's job is
    submitted: eval's came after train's was queued. The sweep refuses it first, in one line."""
    proc = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "slurm", "-p", f"output={tmp_path}", "-p", override, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    key = override.partition("=")[0]
    assert proc.stderr == f"hpcrl: error: {key}: 3 GPUs per node, but no node of Slurm's default partition debug has more than 2 (sinfo %G): sbatch would refuse the job\n"
    assert list(tmp_path.iterdir()) == []
    fits = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "slurm", "--dry-run", "-p", f"output={tmp_path}", "-p", override.replace("3", "2"), cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr


def test_slurm_gpus_are_read_from_sinfo_gres() -> None:
    assert gres_gpus("gpu:2") == 2 and gres_gpus("(null)") == 0 and gres_gpus("mps:100") == 0
    assert gres_gpus("gpu:a100:4(S:0-1)") == 4
    assert gres_gpus("gpu:a100:2,gpu:v100:2(S:0,1),mps:200") == 4
    assert gres_gpus("gpuish:8,shard:gpu:3") == 0  # other resources that only look like GPUs


@pytest.mark.sge
def test_a_task_asking_more_slots_than_any_host_has_is_refused_on_grid_engine(sge_cluster: None, tmp_path: Path) -> None:
    """qsub takes a task bigger than every host and Grid Engine keeps it waiting for ever ("cannot run in PE
    smp because it only offers 0 slots"): refused in one line, exit 2, nothing written. The test cell's one
    host has 2 slots per core (tests/clusters/sge.sh), read here from qstat -f."""
    most = max(host_slots(subprocess.run(["qstat", "-f"], capture_output=True, text=True).stdout).values())
    proc = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "sge", "-p", f"output={tmp_path}", "-p", f"resources.cpus={most + 1}", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"hpcrl: error: resources.cpus: {most + 1} slots on one host, but the largest host of any queue has {most} (qstat -f): the task would wait for ever\n"
    assert list(tmp_path.iterdir()) == []
    fits = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "sge", "--dry-run", "-p", f"output={tmp_path}", "-p", f"resources.cpus={most}", cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr


@pytest.mark.sge
@pytest.mark.parametrize(("override", "refusal"), [
    ("resources.gpus=1", "resources.gpus: 1 GPUs as Grid Engine's consumable 'cuda', but no host of any queue offers it (qstat -f -F cuda): "
     "the task would never start; resources.sge_gpu_resource names the site's GPU complex (qconf -sc lists them)"),
    ("eval.gpus=1", "eval.gpus: 1 GPUs as Grid Engine's consumable 'cuda', but no host of any queue offers it (qstat -f -F cuda): "
     "the task would never start; resources.sge_gpu_resource names the site's GPU complex (qconf -sc lists them)"),
    ("resources.gpus=3", "resources.gpus: 3 GPUs on one host, but no host of any queue holds more than 2 'gpu' (qconf -se): the task would wait for ever"),
    ("eval.gpus=3", "eval.gpus: 3 GPUs on one host, but no host of any queue holds more than 2 'gpu' (qconf -se): the task would wait for ever"),
])  # fmt: skip
def test_gpus_no_host_can_give_are_refused_on_grid_engine(sge_cluster: None, tmp_path: Path, override: str, refusal: str) -> None:
    """A site whose GPU complex is not `gpu`: qsub refuses `-l gpu=1` ("unknown resource"), but only when
    that stage is submitted (eval's after train's was queued); more GPUs than the host holds wait for ever
    ("cannot run at host vm because it offers only hc:gpu=2"). The sweep refuses both in one line, with
    nothing written; the test cell's one host has 2 of the consumable `gpu` (tests/clusters/sge.sh)."""
    site = ["-p", "resources.sge_gpu_resource=cuda"] if "cuda" in refusal else []
    proc = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "sge", "-p", f"output={tmp_path}", "-p", override, *site, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr == f"hpcrl: error: {refusal}\n", proc.stderr
    assert list(tmp_path.iterdir()) == []
    fits = hpcrl("sweep", str(CONFORMANCE), "--scheduler", "sge", "--dry-run", "-p", f"output={tmp_path}", "-p", override.replace("3", "2"), cwd=tmp_path)
    assert fits.returncode == 0, fits.stderr


def test_grid_engine_gpus_read_from_qstat_f_f_and_qconf_se() -> None:
    listing = """queuename                      qtype resv/used/tot. load_avg arch          states
---------------------------------------------------------------------------------
all.q@node1                    BIP   0/0/4          0.01     lx-amd64
\thc:gpu=2
---------------------------------------------------------------------------------
gpu.q@node1                    BIP   0/0/4          0.01     lx-amd64
\thc:gpu=1.000000
---------------------------------------------------------------------------------
gpu.q@node2                    BIP   0/0/8          0.01     lx-amd64
\tqc:cuda=0
"""
    assert offered(listing, "gpu") == {"node1": 2.0}  # the most any of its queue instances has free
    assert offered(listing, "cuda") == {"node2": 0.0}  # a queue consumable counts, even at 0 free now
    assert offered(listing, "gp") == offered(listing, "gpus") == offered(listing, "mem_free") == {}
    assert complex_value("hostname n1\ncomplex_values        gpu=4,mem_free=64G\n", "gpu") == 4.0
    assert complex_value("complex_values        mem_free=64G,gpu=8\n", "gpu") == 8.0
    assert complex_value("complex_values        ngpu=4\n", "gpu") is None and complex_value("complex_values NONE\n", "gpu") is None


def test_grid_engine_slots_are_added_up_per_host_from_qstat_f() -> None:
    listing = """queuename                      qtype resv/used/tot. load_avg arch          states
---------------------------------------------------------------------------------
all.q@node1                    BIP   0/2/16         1.02     lx-amd64
---------------------------------------------------------------------------------
gpu.q@node1                    BIP   0/0/4          1.02     lx-amd64      d
---------------------------------------------------------------------------------
all.q@node2                    BP    0/8            0.50     lx-amd64

############################################################################
 - PENDING JOBS - PENDING JOBS - PENDING JOBS - PENDING JOBS - PENDING JOBS
############################################################################
   1017 0.50000 conformanc root         qw    11/26/2026 09:15:24                                    8 1-3:1
"""
    assert host_slots(listing) == {"node1": 20, "node2": 8}
    assert host_slots("") == {}


@pytest.mark.slurm
def test_a_refused_resweep_restores_the_experiment_as_it_was(slurm_cluster: None, tmp_path: Path) -> None:
    """An existing experiment: a new grid point refused by sbatch leaves runs.csv and the run dirs as before."""
    exp = load_experiment(CONFORMANCE, [f"output={tmp_path}", "sweep.seeds=[0]"])
    runs = merge_runs(exp.dir, expand(exp))
    write_experiment(exp, runs, {})
    before = {p.name: p.read_bytes() for p in (exp.dir / "runs.csv", exp.dir / "experiment.yaml")}
    grown = load_experiment(CONFORMANCE, [f"output={tmp_path}", "sweep.seeds=[0,1]", "resources.partition=no-such-partition"])
    with pytest.raises(SchedulerError):
        submit_experiment(grown, "slurm", out=io.StringIO())
    assert {p.name: p.read_bytes() for p in (exp.dir / "runs.csv", exp.dir / "experiment.yaml")} == before
    assert sorted(p.name for p in (exp.dir / "runs").iterdir()) == [runs[0].run_id]
    assert not list((exp.dir / "jobs").glob("*.sh")) and not (exp.dir / "jobs" / "jobs.json").exists()


# ------------------------------------------------------------------------------------ item 16


@pytest.mark.parametrize("damaged", ["jobs.json", "local-state.json"])
def test_a_damaged_job_record_is_one_line_exit_2(damaged: str, tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    (exp / "jobs").mkdir(parents=True)
    (exp / "runs.csv").write_text("index,run_id,seed\n")
    job = {"stage": "train", "job_id": "train-0-0", "scheduler": "local", "script": "jobs/train-0-0.sh", "size": 1, "manifest": None}
    (exp / "jobs" / "jobs.json").write_text(json.dumps([job]))
    (exp / "jobs" / damaged).write_text('{"jobs": {"train-0-0": {"1": {"sta')  # torn by a full disk
    for command in ("status", "cancel"):
        proc = hpcrl(command, str(exp), cwd=tmp_path, timeout=60)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.count("\n") == 1 and damaged in proc.stderr and "Traceback" not in proc.stderr


# ------------------------------------------------------------------------------------ item 19


def test_what_one_node_must_hold_comes_from_the_stages_resources(tmp_path: Path) -> None:
    """The clusters' refusal compares these with their largest node: training's CPUs times its ranks on
    a node and its memory, and a distributed run's actors, each named by the key that asks."""
    ranks = load_experiment(write_config(tmp_path, {"resources": {"cpus": 3, "ranks": 4, "nodes": 2, "mem": "6G"}}))
    assert node_requests(ranks)[0] == NodeRequest("resources.cpus", 6, "resources.mem", "6G", 6144, gpus=0, gpus_key="resources.gpus")
    assert node_requests(ranks)[0].cpus_detail == " (2 ranks x 3)"  # what the refusal's message says the 6 are
    apex = load_experiment(Path(__file__).resolve().parents[2] / "configs" / "cartpole_apex.yaml", ["distributed.actor_cpus=2", "distributed.actor_mem=3G"])
    assert [(r.cpus_key, r.cpus, r.mem_key, r.mem_mb, r.gpus) for r in node_requests(apex)][2] == ("distributed.actor_cpus", 2, "distributed.actor_mem", 3072, 0)
    gpus = load_experiment(write_config(tmp_path, {"resources": {"gpus": 2}, "eval": {"gpus": 1}}))
    assert [(r.gpus_key, r.gpus) for r in node_requests(gpus)] == [("resources.gpus", 2), ("eval.gpus", 1)]  # each stage's GPUs, by its key


def test_each_stage_asks_for_its_own_resources(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"resources": {"gpus": 2, "cpus": 8, "mem": "32G", "partition": "gpu", "extra": ["--constraint=a100"]}, "eval": {"gpus": 1}})
    exp = load_experiment(config)
    planned = {p.stage: p for p in plan_scripts(exp, get_scheduler("slurm", exp.dir), [0, 1], 0)}
    train, evaluation, aggregate = planned["train"], planned["eval"], planned["aggregate"]
    assert (train.resources.gpus, train.resources.cpus, train.resources.mem_mb) == (2, 8, 32768)
    assert (evaluation.resources.gpus, evaluation.resources.partition) == (1, "gpu")
    assert (aggregate.resources.gpus, aggregate.resources.cpus, aggregate.resources.mem_mb) == (0, 1, 2048)
    assert aggregate.resources.partition is None and aggregate.resources.extra == []
    for line in ("--partition=gpu", "--constraint=a100", "--gres", "--mem=32768M"):
        assert line in train.text and line not in aggregate.text
    assert "--cpus-per-task=1" in aggregate.text and "--mem=2048M" in aggregate.text
    assert stage_resources(exp, "aggregate") == aggregate.resources


def fake_experiment(directory: Path, jobs: list[dict], script: str) -> Path:
    """An experiment directory holding only jobs.json and one script per job: what the runner reads."""
    (directory / "jobs" / "logs").mkdir(parents=True)
    for job in jobs:
        (directory / job["script"]).write_text(script)
    (directory / "jobs" / "jobs.json").write_text(json.dumps(jobs))
    return directory


def local_job(job_id: str, size: int, gpus: int, cpus: int = 1, after: list | None = None) -> dict:
    resources = {"gpus": gpus, "cpus": cpus, "max_concurrent": None, "mem_mb": 100}
    return {"stage": job_id.split("-")[0], "job_id": job_id, "scheduler": "local", "script": f"jobs/{job_id}.sh", "size": size,
            "manifest": None, "after": after or [], "attempt": 0, "resources": resources}


# Each task records the devices it was given, then waits until `expect` tasks have started: a task
# the pool never starts beside the others makes them all time out and fail.
GANG = """#!/bin/bash
here=$(dirname "$0")
echo "${CUDA_VISIBLE_DEVICES-unset}" > "$here/devices.$(basename "$0" .sh).$HPCRL_TASK_ID"
for _ in $(seq 100); do
  [ "$(ls "$here" | grep -c '^devices\\.')" -ge EXPECT ] && exit 0
  sleep 0.1
done
exit 1
"""


def devices(exp: Path) -> dict[str, str]:
    return {p.name.removeprefix("devices."): p.read_text().strip() for p in (exp / "jobs").glob("devices.*")}


def test_local_pool_starts_actors_beside_a_learner_on_the_only_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """16 cores and one GPU: the learner takes the GPU, its two actors still start beside it."""
    from hpcrl.schedulers import local

    monkeypatch.setattr(local, "gpu_count", lambda: 1)
    monkeypatch.setattr(local, "usable_cores", lambda: 16)
    exp = fake_experiment(tmp_path / "exp", [local_job("learner-0-0", 1, gpus=1), local_job("actors-0-0", 2, gpus=0)], GANG.replace("EXPECT", "3"))
    assert local.LocalRunner(exp).run() == 0
    assert devices(exp) == {"learner-0-0.1": "0", "actors-0-0.1": "", "actors-0-0.2": ""}


def test_local_gpus_are_split_one_per_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Two GPUs, three one-GPU tasks: two run at once on different devices, the third gets a freed one;
    a CPU-only task sees no GPU at all."""
    from hpcrl.schedulers import local

    monkeypatch.setattr(local, "gpu_count", lambda: 2)
    monkeypatch.setattr(local, "usable_cores", lambda: 16)
    exp = fake_experiment(tmp_path / "exp", [local_job("train-0-0", 3, gpus=1), local_job("eval-0-0", 1, gpus=0)], GANG.replace("EXPECT", "2"))
    assert local.LocalRunner(exp).run() == 0
    seen = devices(exp)
    gpu_tasks = [seen[f"train-0-0.{t}"] for t in (1, 2, 3)]
    assert sorted(gpu_tasks[:2]) == ["0", "1"] and gpu_tasks[2] in ("0", "1")
    assert seen["eval-0-0.1"] == ""


# ------------------------------------------------------------------------------------ items 11 and 14


@pytest.mark.e2e
def test_a_successful_local_retry_exits_0_without_the_old_failures(tmp_path: Path) -> None:
    real = sys.executable
    failing = standin(tmp_path / "bin", "python", f'[ "$3" = train ] && {{ echo "node died" >&2; exit 3; }}\nexec {real} "$@"\n')
    config = write_config(tmp_path, {"sweep": {"seeds": [0]}})
    first = hpcrl("sweep", str(config), "--scheduler", "local", "-p", f"python={failing}", cwd=tmp_path)
    assert first.returncode == 1 and "1 failed" in first.stdout, first.stdout + first.stderr
    second = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path)
    assert second.returncode == 0, second.stdout + second.stderr
    assert "failed" not in second.stdout and "submitted 1 of 1 runs" in second.stdout


@pytest.mark.e2e
def test_sweep_retries_a_failed_evaluation_without_training_again(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"sweep": {"seeds": [0, 1]}})
    exp = tmp_path / "logs" / "tiny"
    assert hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path).returncode == 0
    runs = load_runs(exp)
    broken = run_dir(exp, runs[1].run_id)
    rundir.mark(broken, rundir.EVAL_FAILED, "CUDA error: out of memory")
    (broken / "eval.csv").unlink(missing_ok=True)
    checkpoints = sorted(p.stat().st_mtime_ns for p in (broken / "checkpoints").glob("*"))
    proc = hpcrl("sweep", str(config), "--scheduler", "local", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "submitted 0 of 2 runs and 1 evaluations" in proc.stdout
    newest = [j for j in read_jobs(exp) if j.attempt == 1]
    assert [j.stage for j in newest] == ["eval", "aggregate"] and newest[0].after == []
    assert (exp / newest[0].manifest).read_text().split() == [str(runs[1].index)]
    assert rundir.eval_state(broken) == "done" and (broken / "eval.csv").exists()
    assert sorted(p.stat().st_mtime_ns for p in (broken / "checkpoints").glob("*")) == checkpoints  # not retrained
    assert newest[0].resources["gpus"] == 0 and newest[1].resources["cpus"] == 1


# ------------------------------------------------------------------------------------ manifests


def train_logs(exp: Path, scheduler: str, job_id: str, task: int) -> str:
    pattern = {"local": f"{job_id}.{task}.out", "slurm": f"train-{job_id}_{task}.out", "sge": f"train-{job_id}.{task}.out"}[scheduler]
    return "".join(p.read_text() for p in (exp / "jobs" / "logs").glob(pattern))


@pytest.fixture(params=["local", pytest.param("slurm", marks=pytest.mark.slurm), pytest.param("sge", marks=pytest.mark.sge)])
def backend(request: pytest.FixtureRequest) -> str:
    if request.param != "local":
        request.getfixturevalue(f"{request.param}_cluster")
    return request.param


@pytest.mark.e2e
def test_task_i_runs_the_run_on_manifest_line_i(backend: str, tmp_path: Path) -> None:
    """With run 1 already done, the train array is runs [0, 2]: not the identity, so a reversed or
    shifted task -> run mapping trains the wrong run (or run 1) and fails here."""
    exp = load_experiment(CONFORMANCE, [f"output={tmp_path}", "train.total_steps=256"])
    runs = merge_runs(exp.dir, expand(exp))
    write_experiment(exp, runs, {})
    for name in (rundir.DONE, rundir.EVAL_SKIPPED):  # run 1 needs nothing: no eval-only job either
        rundir.mark(run_dir(exp.dir, runs[1].run_id), name, "done elsewhere")
    assert submit_experiment(exp, backend, detach=True, out=io.StringIO()) == 0
    (train,) = [j for j in read_jobs(exp.dir) if j.stage == "train"]
    assert (exp.dir / train.manifest).read_text().split() == ["0", "2"]
    deadline = time.monotonic() + 300
    try:
        while not all(rundir.eval_state(run_dir(exp.dir, runs[i].run_id)) != "new" for i in (0, 2)):
            assert time.monotonic() < deadline, "the sweep did not finish"
            time.sleep(1)
    finally:
        cancel_experiment(exp.dir, out=io.StringIO())
    for task, index in ((1, 0), (2, 2)):
        log = train_logs(exp.dir, backend, train.job_id, task)
        assert f"{runs[index].run_id}: done at step" in log, log
        assert all(r.run_id not in log for r in runs if r.index != index)
        assert (run_dir(exp.dir, runs[index].run_id) / "train.csv").exists()
    assert not (run_dir(exp.dir, runs[1].run_id) / "train.csv").exists()
