"""Command-line adapters over the semgov core."""
