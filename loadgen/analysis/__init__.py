"""Every figure, computed from the records alone: windows, statistics, metrics, Pareto, compare."""
