"""Prefill routing policies, one module each behind one interface (base.PrefillPolicy): round_robin,
random_choice, power_of_two, cache_aware (with the named-prefix rule, named_prefix.py, and the placement of
prompts no worker holds, placement.py). core/routing/policy.py picks one by name; all are pure functions of
frozen snapshots."""
