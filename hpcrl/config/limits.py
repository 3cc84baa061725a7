"""Bounds on what a user may ask for, in a module without dependencies: the config schema checks them, and so
do the benchmarks' arguments, which are also parsed in other projects' venvs (Sample Factory's, OpenSpiel's)."""

MAX_RUNS = 100_000
"""Runs one sweep may have (grid points x seeds), checked before any run is made: a scheduler's
array limit is far lower, and a typo in a grid must not take the login node's memory."""
MAX_SEED = 2**32 - 1
"""The largest seed: numpy's legacy seeding (gymnasium's and SB3's) takes 0 .. 2**32-1."""
MAX_ENVS = 4096
"""Environments of one run (env.num_envs, distributed.envs_per_actor): each is a simulator."""
