"""Where a pipeline's stage requests go: each stage its own endpoint, model and API.

A rag-pipeline session is a user request made of stage requests (embed the query, rerank the
candidates, generate the answer: ``workload.rag_pipeline``). Each stage may be served by its own
service (``--endpoint-embed``, ``--endpoint-rerank``, ``--model-embed``, ``--model-rerank``);
a stage without its own is sent to the run's endpoint and model. Every stage shares the run's
endpoint options (headers, key, TLS): a stage endpoint is one more route of the same deployment,
reached the same way. The engine opens one transport per stage (its own connection pool).
"""

from __future__ import annotations

from dataclasses import dataclass

from loadgen.errors import ConfigError

__all__ = ["STAGE_APIS", "StageEndpoint"]

# the stages a pipeline names, and the API each speaks ("" = the run's own API: generate)
STAGE_APIS = {"embed": "embeddings", "rerank": "rerank", "generate": ""}


@dataclass(frozen=True)
class StageEndpoint:
    """One stage's endpoint: its base URL (as ``--endpoint``), model and endpoint label."""

    stage: str
    url: str
    model: str
    label: str = ""

    @property
    def api(self) -> str:
        """The API the stage speaks ("" for generate: the run's own)."""
        return STAGE_APIS[self.stage]

    def __post_init__(self) -> None:
        if self.stage not in STAGE_APIS:
            raise ConfigError(f"stage {self.stage!r}: one of {', '.join(STAGE_APIS)}")
        flag = f"--endpoint-{self.stage}"
        if not isinstance(self.url, str) or not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{flag} {self.url!r}: expected an OpenAI base URL like http://127.0.0.1:8000/v1")
        if not isinstance(self.model, str) or not self.model.strip():
            raise ConfigError(f"--model-{self.stage} {self.model!r}: give a model name")
