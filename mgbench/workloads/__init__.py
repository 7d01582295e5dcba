"""Training workloads. Each exposes a model builder, a batch source and FLOPs per token."""
