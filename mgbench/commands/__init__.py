"""Click commands that are more than a line in cli.py: each module parses and prints, and
calls domain functions that take no click (planner/, probe/, ...), so the planner's
model imports no command-line library."""
