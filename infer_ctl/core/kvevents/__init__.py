"""What a KV-events publisher and a KV-events consumer must agree on, shared by the simulator (which
publishes) and the router (which consumes): SGLang 0.5.23's page hash chain (`hashing`) and the
simulator's built-in tokenizer and chat template (`sim_tokenizer`: a router sees a simulated worker's
prompt as that worker does). Pure: no I/O."""
