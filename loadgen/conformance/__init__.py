"""Verdicts for CI and bake-offs: SLO profiles and the gate, and the endpoint honesty check."""
