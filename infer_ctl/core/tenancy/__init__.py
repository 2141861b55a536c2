"""Tenants' limits and cost attribution as plain math: token buckets, the share clock that splits a
worker's time between the requests in flight on it, and the price of one worker from the lease
pricing of core/sizing/cost.py."""
