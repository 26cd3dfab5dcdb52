"""The request path: the front end, routing and admission, request and instance states, the instance serving loop and what it runs, pipelines as compiled, dynamic batching."""
