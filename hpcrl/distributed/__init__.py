"""Decoupled actors and learner for runs that outgrow one job (Ape-X style, over Redis).

Per run, one learner job (GPU when there is one) and an array of CPU actor jobs:

- the learner starts its own `redis-server` (or uses an external one), writes a rendezvous file
  into the run directory (host, port, password; mode 600) and publishes parameters on the board;
- actors find it through that file, step their envs with a per-actor epsilon, and push batches of
  transitions onto a bounded queue, several per round trip when they come fast; they block when it
  is full (backpressure, counted);
- the learner pops batches, drops the ones produced with parameters older than the lag limit
  (counted), learns from a replay buffer, checkpoints everything a requeued job needs, and writes
  a stats file that `hpcrl status` reads without talking to Redis.

Nothing that crosses the network is pickled: batches and parameters are raw numpy buffers behind
a fixed header (`wire.py`), heartbeats are small JSON objects.

Modules: wire (format), rendezvous, redis_server, board (status, heartbeats, parameters),
queue (producer/consumer), apex (the DQN learner and acting policy), selfplay (AlphaZero's
trainer and self-play halves: the same jobs run AlphaZero decoupled), pace (when the learner updates
and takes data: the set ratio and its slack), learner and actor (the job
entry points, which take either half), runstats (the stats file and status line); the job plan is
hpcrl.submit.distributed.
"""
