"""Trace replay: real traces read into workloads, one module per format."""
