"""Facts: one module per domain, each a command that gathers a fact plus a pure parser of its output.

Parsers take text (or JSON) and return plain dataclasses; they never touch a connector, so they are
tested on real tool outputs (tests/fixtures/) without any host.
"""
