"""Pure routing logic of the router daemon: prefix index, placement policy, PD request fields,
named-prefix lifecycle, circuit breaker and retry backoff. No I/O: time and randomness are passed in."""
