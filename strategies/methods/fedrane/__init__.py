"""FedRANE's server side, GNE (seed 000, docs/FEDRANE.md): ``strategy`` (GNEStrategy: the round, the step scale,
what results.json records) and ``nash`` (the Nash-bargaining weights: delta Gram matrix and solvers, pure
functions)."""
