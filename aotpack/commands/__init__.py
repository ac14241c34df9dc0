"""The command line: build, run, inspect, verify, diff, cache."""
