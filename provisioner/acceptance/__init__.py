"""Fabric acceptance (issue 26): parsers for the outputs of the acceptance tools (nccl-tests,
``nvbandwidth``, ``dcgmi diag -j``, perftest's ``ib_write_bw``), the fabric classes with their
published floors, and the judge that holds each figure against its floor.

Pure: standard library and ``provisioner.errors`` only. The CLI (``provisioner fabric judge``)
and, later, the daemon's acceptance stage read files or SSH output and hand the text here.
"""
