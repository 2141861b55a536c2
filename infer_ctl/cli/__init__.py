"""Typer commands: parse, call one function, render. No logic and no I/O of their own."""
