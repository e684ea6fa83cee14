"""Traffic: what each request sends, as a pure function of (workload spec, seed, index)."""
