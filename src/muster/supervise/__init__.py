"""Supervision: attempts, the failure policy and reconciliation after a restart."""
