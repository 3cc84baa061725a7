"""The learning side: environments, networks, algorithms and the job entry points."""
