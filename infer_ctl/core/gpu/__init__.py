"""GPU health, pure: the fact vocabulary (`facts.py`) the gatherers in infer_ctl/facts/ fill, and the
rules (`rules.py`) that judge those facts against the profile's `gpu` policy."""
