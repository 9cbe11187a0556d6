"""Fabric topology: NVLink domains and InfiniBand placement (issue 7, docs/topology.md).

Everything in this package is pure (standard library and ``provisioner.errors`` only):
``parse_*`` turn tool output into records, ``fabric``/``fleet`` build the graph in ``model``
(``rate``: link rates; ``health``: link findings), ``hostlist`` compresses Slurm host lists,
``emit`` renders Slurm and Kubernetes outputs. Reading files is the caller's job, except
``parse_sysfs.read_sysfs_tree``, a blocking directory walker meant for an executor.
"""
