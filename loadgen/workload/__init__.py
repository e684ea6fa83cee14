"""Traffic: what each request sends, as a pure function of (workload spec, seed, index).

``load`` reads a spec into a ``Workload`` (``base``); ``synthetic`` generates chat,
RAG and agent sessions and ``traces`` replays recorded ones. All of them draw text
through ``text`` and ``tokenizer`` and lengths from ``distributions``, and hand the
engine ``session.Session``s, so the engine never knows which kind it is sending.
"""
