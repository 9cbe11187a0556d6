"""Helpers for the topology tests: synthetic nvidia-smi reports and fixture paths."""
