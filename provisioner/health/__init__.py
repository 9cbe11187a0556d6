"""Health findings from saved evidence: pure classifiers over the text a node's tools print.

``model`` holds the finding (class, recommended action, evidence, source); ``xid`` the
NVIDIA XID catalogue; ``kernel_log``, ``nvsmi``, ``sel``, ``dcgm`` and ``ib`` turn one
tool's output into findings; ``classify`` detects which tool printed a text and runs its
classifier. Standard library and ``provisioner.errors`` only (plus the pure ibstat parser
of ``provisioner.topology``): the CLI runs it offline, the daemon on what its probes bring.
"""
