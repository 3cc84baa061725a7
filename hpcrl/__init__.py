"""hpcrl: one YAML file to trained, evaluated and plotted RL results on Slurm, Grid Engine or a laptop."""

__version__ = "0.1.0"
