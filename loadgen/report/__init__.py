"""Renderers: the terminal, report.html and its charts, compare.html, from the analysis of records."""
