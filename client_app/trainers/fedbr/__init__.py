"""FedBR's client side (Guo, Tang & Lin, ICML 2023; seed 003), one package:

- :mod:`client_app.trainers.fedbr.trainer`     ``FedBRTrainer``: the round's max and min steps as loss terms of the
  one local loop (pseudo batch, max step on the projection head, L_con, the pseudo-data classification term);
- :mod:`client_app.trainers.fedbr.pseudo_data` the pseudo-data (RSM, Mixture, the proxy set) and the losses on it
  (L_con, soft cross-entropy, mixup) as pure functions, unit-tested one by one.

Keys and config section: flcore/methods/fedbr.py; server side: strategies/methods/fedbr.py; the projection head
P_theta: models/extras.py.
"""
