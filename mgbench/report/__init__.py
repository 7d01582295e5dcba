"""HTML reports (figures.py: one function per figure; html.py: one self-contained file)
and run comparison (compare.py)."""
