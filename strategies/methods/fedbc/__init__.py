"""FedBC's server side (seed 001, Algorithm 1): ``strategy`` (FedBCStrategy, FedBCUniformStrategy: the round)
and ``duals`` (the Lagrange multipliers' and gamma's updates and the dual-weighted average, as pure functions)."""
