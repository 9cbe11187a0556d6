"""The validation gate (DESIGN §2, issue 7): a node's hardware against its profile, and its
NVLink domain complete, before it is handed to Slurm. Pure: standard library, errors and the
topology parsers only; ``lifecycle/validation.py`` does the I/O."""
