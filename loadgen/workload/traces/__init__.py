"""Trace replay: real traces read into workloads, one module per format.

``build`` maps a spec's ``format:`` to its reader; ``fields`` (reading and field
errors), ``timed`` (the table and workload of the timed formats), ``blocks``
(text for hash-id blocks) and ``csv_rows`` are what the readers share.
"""
