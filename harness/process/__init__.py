"""Process plumbing: usage errors and exit statuses, the table of child jobs, and how children are started."""
