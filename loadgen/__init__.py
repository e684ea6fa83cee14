"""loadgen: an open-loop load generator and honest meter for OpenAI-compatible LLM endpoints.

The CLI is a thin shell over this library: ``run`` produces records, ``report``
folds them into figures, and both work on run folders, so any run can be
re-reported later.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
