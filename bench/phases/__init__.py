"""The bench's phases, one module per phase or group; each returns its typed result (bench/schema.py)."""
