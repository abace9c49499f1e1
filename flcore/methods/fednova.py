"""FedNova (Wang et al., NeurIPS 2020): normalised averaging by each client's number of local steps."""

from flcore.declaration import BASE_TRAINER, MethodDecl

METHODS = [MethodDecl("fednova", "Wang et al., NeurIPS 2020 (FedNova)", "strategies.methods.fednova:FedNovaStrategy",
                      BASE_TRAINER)]
