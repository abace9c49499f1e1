"""FedAvg (McMahan et al., AISTATS 2017): E epochs of local SGD, sample-size weighted averaging."""

from flcore.declaration import BASE_TRAINER, FEDAVG_STRATEGY, MethodDecl

METHODS = [MethodDecl("fedavg", "McMahan et al., AISTATS 2017 (FedAvg)", FEDAVG_STRATEGY, BASE_TRAINER)]
