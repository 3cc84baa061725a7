"""What an experiment leaves on disk: the run directory's files."""
