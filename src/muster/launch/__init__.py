"""Launchers: start, observe and stop replicas (local shims now, Ray later)."""
