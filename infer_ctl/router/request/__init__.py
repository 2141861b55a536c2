"""The request path: the router's entry point (proxy), admission, context, picking, attempts, relaying, retries, feedback."""
