"""Where it runs: the stage graph, each stage's resources, the job plans of distributed runs."""
