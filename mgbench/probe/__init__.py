"""`mgbench probe`: microbenchmarks of the machine at hand, kept as a hardware profile
that the planner predicts with (``--hardware PROFILE``)."""
