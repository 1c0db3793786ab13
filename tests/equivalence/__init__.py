"""Property-based equivalence with the references across layers and both adapters (Hypothesis)."""
