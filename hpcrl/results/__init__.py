"""From run files to tables, plots, statistics and the report (no training stack)."""
