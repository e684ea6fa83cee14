"""Distributed runs on Locust's master/worker runners: one schedule, a shard per worker, the records home.

The ``loadgen`` command's side (``master``, ``merge``, ``lost``, ``clock_sync``, ``relay``,
``frames``, ``protocol``) never imports Locust. Locust (and with it gevent's monkey-patching)
is imported only by the two control processes started as commands, ``master_node`` and
``worker`` (and ``web``, which they use); the engine runs in ``engine_child``, a plain
asyncio process a worker starts. docs/distributed.md tells the whole story.
"""
