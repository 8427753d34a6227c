"""Tests that start sidecar processes: the launcher, the server, faults and the wire, end to end."""
