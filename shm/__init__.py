"""Token-based zero-copy tensor sharing on shared / unified memory (InfScaler §IV-B, Fig. 4).

Not built yet: see the tensor-sharing issue.
"""
