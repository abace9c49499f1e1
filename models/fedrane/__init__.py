"""FedRANE's model part, the LRA neck (seed 000, Sec. 3.3; docs/FEDRANE.md). It is built on both sides (the
server builds the initial model and evaluates the global one through the neck; the clients train it), so it lives
here, below server and client, not in either side's package:

- :mod:`models.fedrane.relation_graph`   which samples exchange messages: Pearson correlations, SLIM weights,
  neighbour sets (steps 1-3 of LRA), pure functions;
- :mod:`models.fedrane.neck`            attentive message passing, L_CD and ``LRANeck`` with its model hook
  ``add_lra_neck`` (the declaration's ``model_hook``);
- :mod:`models.fedrane.graph_attention` the authors' GAT layer (``fedrane.lra-gnn = gat``).
"""
