"""HTTP plumbing of the data plane: the HTTP/1.1 server (h1), the upstream client, SSE, JSON."""
