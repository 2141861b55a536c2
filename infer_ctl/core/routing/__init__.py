"""Pure routing logic of the router daemon: prefix index, placement policy, PD request fields,
named-prefix lifecycle, circuit breaker and retry backoff, the decoder of SGLang's speculative-decoding
fields (`spec_fields`, also read by the checks and the bench). No I/O: time and randomness are passed in."""
