"""The command API: HTTP in, commands out, views out. It decides nothing itself."""
