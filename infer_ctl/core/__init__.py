"""Pure logic: findings, exit codes, rules, plans, sizing math, routing policy.

Nothing in this package performs I/O or imports typer, rich, paramiko, httpx or aiohttp
(the import-linter contracts in pyproject.toml enforce it), so all of it is testable without hosts or sockets.
"""
