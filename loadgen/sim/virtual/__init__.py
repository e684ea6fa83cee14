"""The simulated engine in virtual time: a discrete-event run with no sockets and no real clock.

The same engine model as ``loadgen sim`` (the continuous-batching scheduler, KV blocks, the
prefix cache, preemption and the roofline step cost of ``RooflineModel``) run step after step
on a virtual clock: the workload's sessions and the schedule's instants feed it directly
(closed loop within a session: turn k+1 is due ``think_ns`` after turn k's last token), and
every request becomes an ordinary ``Record`` (``endpoint`` "sim-virtual", times in virtual ns
from the run's start, one chunk per streamed event as a perfect client would stamp it). A run
or sweep point of minutes of traffic takes seconds, and every report, gate and compare reads it.

Public entry points (what ``loadgen run|sweep --sim-virtual`` and ``loadgen plan`` call):

``simulate(workload, offsets_ns, engine, *, run_id, seed=0, sim=None, point=0, api="chat",
concurrency=None, duration_ns=None, max_requests=None, drain_ns=None) -> VirtualRun``
    Run sessions ``0, 1, ...`` of ``workload`` into ``engine`` (a fresh ``RooflineModel``, which
    the run consumes: build one per run), session i arriving at ``offsets_ns[i]`` (open loop
    across sessions), or, with ``concurrency`` and ``offsets_ns`` None, ``concurrency`` closed-loop
    users each starting the next session when its last ended. ``duration_ns`` stops new sessions
    (and, closed loop, users) from starting at that instant; ``max_requests`` caps the sessions
    started (a session's later turns still go); a request still running ``drain_ns`` after the
    duration is recorded ``cancelled``.
    ``sim`` is the server's answer configuration (``SimConfig``: answer lengths without
    ignore_eos, tokens per chunk, tool-call share); its faults are not modelled (a run refuses them).

``simulate_point(workload, arrival, engine, *, run_id, seed, duration_s, requests=None, point=0,
sim=None, api="chat", drain_s=30.0, ignore_eos=True) -> VirtualRun``
    One load point as a sweep sends it: the schedule of ``arrival`` (``schedule.Arrival``:
    constant, poisson, gamma, closed or trace) over ``duration_s`` with ``seed``, as
    ``client.point.build_plan`` derives it, then ``simulate``.

``VirtualRun``
    ``records`` (a ``pyarrow.Table`` in ``records.SCHEMA``), ``truth`` (the engine's ground truth
    per request, a ``pyarrow.Table``: rid, arrival/queue/prefill instants, cached tokens,
    preemptions), ``stats`` (the engine's counters, the keys of ``RooflineModel.stats()``),
    ``end_ns`` (the virtual instant the last step ended) and ``wall_s`` (what it cost here).
"""

from loadgen.sim.virtual.run import VirtualRun, simulate, simulate_point

__all__ = ["VirtualRun", "simulate", "simulate_point"]
