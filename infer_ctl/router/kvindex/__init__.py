"""The KV index: KV-event subscriber, exact-index routing, prompt tokenisation, KV settings."""
