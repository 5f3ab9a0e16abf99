"""The `tenure` command line: run the system, create topics, and decode topics for humans."""
