"""What to try: the runs of an experiment (grid, random search, Optuna study) and their identity."""
