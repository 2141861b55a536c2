"""More than one router: leader and followers of a multi-process router, the merged /metrics, replicas sharing state through Redis."""
