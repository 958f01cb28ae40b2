"""Results over time: a database of runs (SQLite or PostgreSQL), a static site of them, exports for CI dashboards, and a regression gate."""
