"""The per-executor sidecar: server (process), batcher (pure), runner (device), client and launcher.

Importing this package stays light (no torch): tasks import the client and the launcher.
"""
