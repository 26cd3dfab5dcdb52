"""The local inference API: the HTTP server on the Unix socket and its routes, the v2 codec (JSON, binary tensor data, system shared memory), the client, and the Prometheus metrics."""
