"""Commands that make jobs of runs, on the controller's core: a Slurm batch job that runs the lab
on its allocation (``lab submit``: ``submit``) and the benchmark's tables (``lab bench``: ``bench``)."""
