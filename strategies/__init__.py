"""Server-side strategies: the infrastructure they share here, each method's Strategy in strategies/methods/; see
flcore/registry.py for the name mapping."""
