"""SCAFFOLD (Karimireddy et al., ICML 2020): server and client control variates (paper Alg. 1)."""

from dataclasses import dataclass

from flcore.declaration import MethodDecl, Payload, own_backward
from flcore.schema import Section, param

SERVER_C = "scaffold-c"          # server -> client record: the server control variate c
DELTA_C = "scaffold-delta-c"     # client -> server record: c_i+ - c_i
STATE_C_I = "scaffold-c-i"       # client state: this client's control variate c_i


@dataclass(frozen=True)
class ScaffoldConfig(Section):
    NAME = "scaffold"
    option: str = param("II", "how c_i is updated (Alg. 1 line 12): I = full local gradient at x, "
                              "II = from the local updates, c_i - c + (x - y_i)/(K eta_l) (Alg. 1 offers both and "
                              "states no default; II: the cheaper one, no extra pass over the data; no authors' "
                              "code is published)",
                        choices=("I", "II"), old="scaffold-option")
    server_lr: float = param(1.0, "global step size eta_g in x <- x + eta_g mean(y_i - x) (Alg. 1 line 16; 1: "
                                  "averaging the client models, FedAvg's server step)", gt=0, old="server-lr")


METHODS = own_backward([MethodDecl("scaffold", "Karimireddy et al., ICML 2020 (SCAFFOLD)",
                      "strategies.methods.scaffold:ScaffoldStrategy",
                      "client_app.trainers.scaffold:ScaffoldTrainer", config=ScaffoldConfig,
                      payload=Payload(records=(SERVER_C,), reply_records=(DELTA_C,), state=(STATE_C_I,)))])
