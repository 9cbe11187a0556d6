"""provisioner: zero-touch bare-metal provisioning and node lifecycle daemon for GPU clusters."""

__version__ = "0.1.0"
