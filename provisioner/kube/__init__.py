"""Kubernetes join, labels, readiness, drain and sync; only client.py imports kubernetes."""
