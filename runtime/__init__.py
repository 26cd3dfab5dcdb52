"""On-device runtime: engines (CPU / GPU / DLA), partition instances, pipeline routing,
SLO monitor and the asymmetric auto-scaler (InfScaler Algorithm 1).

Not built yet: see the runtime and scaling issues.
"""
