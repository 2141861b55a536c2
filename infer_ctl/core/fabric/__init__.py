"""Pure fabric logic: GID choice (perftest scoring), pair scheduling, pair-result judging."""
