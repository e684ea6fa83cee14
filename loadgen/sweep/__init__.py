"""Sweeps: which load points to send (planned or searched), and running them into one run folder."""
