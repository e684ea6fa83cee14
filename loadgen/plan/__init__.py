"""The capacity planner (``loadgen plan``): deployments swept in virtual time and ranked by cost at an SLO.

``config`` (the deployments: GPU, model, dtypes, TP, replicas, batch limits, P/D split, speculation),
``prices`` (price files: rental tiers and ownership, from ``prices/``), ``search`` (capacity at the
SLO of one deployment, on ``sim.virtual.simulate_point``), ``figures`` (the results as plain data,
for the report layer), ``run`` (every deployment priced and ranked, and along the planner's axes).
"""
