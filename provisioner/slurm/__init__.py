"""Slurm hand-off (Slinky), slurmrestd and scontrol clients, the drain sync both ways."""
