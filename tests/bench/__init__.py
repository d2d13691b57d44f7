"""The bench's pure parts: its typed results and their rendering."""
