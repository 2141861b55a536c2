"""The daemon: the HTTP server and its lifecycle, foreground and embedded runs, the multi-process supervisor."""
