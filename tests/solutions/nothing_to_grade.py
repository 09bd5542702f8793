"""A file that defines nothing the exercise has: a clear failure, not a crash."""
ANSWER = 42
