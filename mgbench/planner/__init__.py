"""Capacity planning: memory and performance models, search, cost.

memory.py and perf.py hold the formulas, written with numpy operations so the same
code answers one question (`mgbench predict`) or millions (`mgbench plan`).
"""
