"""Speculative decoding in operation, pure: what the measured acceptance means (judge.py: recommended
step count, expected speedup, break-even alpha; all from `core.sizing.spec`'s formula), the candidate
steps of SGLang's adaptive mode (adaptive.py), the decode pools of a profile and the launch settings each
runs (pools.py), and the controller's decisions with hysteresis and a cool-down (controller.py).

The measurements come from `core.routing.spec_fields` (the one decoder of SGLang's fields), gathered by
the router (`router/observe/spec_stats.py`) or read from the workers (`checks/spec.py`)."""
