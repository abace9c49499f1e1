"""Which of Flower's faces a method can be offered through, decided from its declaration (flcore/methods/*).

* Flower's ``Strategy.start()`` runs one ``configure_train`` -> ``aggregate_train`` exchange per round: a
  method fits if its declared actions are only ``"train"`` (single exchange). FedUFO relays priors within
  a round (``train.prior`` -> ``train.posterior``) and does not.
* A ``NumPyClient`` (Flower's legacy fit/evaluate face) exchanges one list of arrays (the model) and scalars
  (the fit config, the fit metrics) per round: a method fits if it is single-exchange and sends and returns
  no records besides the model. SCAFFOLD (control variates c, delta c) and FedETF/FedGMV (memory vectors,
  class means) exchange extra arrays with every client and do not.
* Flower's stock ``flwr.serverapp.strategy.FedAvg``, unmodified, drives this project's ClientApp (the
  client then reads the run config of its Context); it reproduces a method if the method's server is
  FedAvg (sample-size weighted mean) and its clients need nothing but the model and ``server-round``.

Also the conventions of that legacy face that both sides share (docs/PROTOCOL.md).
"""

from __future__ import annotations

from typing import Mapping

from flcore import protocol
from flcore.registry import FEDAVG_STRATEGY, MethodDecl

# keys of the legacy fit / evaluate / get_properties config that carry the server's run config
RUN_CONFIG_PREFIX = "run-config."


def start_problem(decl: MethodDecl) -> str | None:
    """Why Flower's ``Strategy.start()`` cannot drive ``decl`` (None: it can)."""
    extra = [a for a in decl.payload.actions if a != protocol.TRAIN]
    if not extra:
        return None
    return (f"method '{decl.name}' exchanges several messages with a client within one round "
            f"({', '.join(decl.payload.actions)}: the server relays what one phase returns into the next), "
            "but Flower's Strategy.start() runs one configure_train/aggregate_train exchange per round")


def numpy_client_problem(decl: MethodDecl) -> str | None:
    """Why a ``NumPyClient`` (fit/evaluate: one list of arrays + scalars) cannot serve ``decl``."""
    problem = start_problem(decl)
    if problem is not None:
        return problem
    pay = decl.payload
    if pay.records or pay.reply_records:
        return (f"method '{decl.name}' exchanges arrays besides the model with every client (to the client: "
                f"{', '.join(pay.records) or 'none'}; back: {', '.join(pay.reply_records) or 'none'}), which "
                "NumPyClient.fit's one parameter list and scalar config/metrics cannot carry")
    return None


def stock_fedavg_problem(decl: MethodDecl) -> str | None:
    """Why Flower's stock FedAvg does not reproduce ``decl`` when it drives our ClientApp (None: it does)."""
    problem = numpy_client_problem(decl)
    if problem is not None:
        return problem
    if decl.payload.config:
        return f"its clients need per-client values ({', '.join(decl.payload.config)}) stock FedAvg does not send"
    if decl.strategy != FEDAVG_STRATEGY:
        return f"its server aggregates differently ({decl.strategy.split(':')[1]}), not by FedAvg's weighted mean"
    return None


def with_run_config(config: Mapping[str, object], run_config: Mapping[str, object]) -> dict[str, object]:
    """A legacy config dict: ``config`` plus the run config under :data:`RUN_CONFIG_PREFIX`."""
    clash = [k for k in config if k.startswith(RUN_CONFIG_PREFIX)]
    if clash:
        raise ValueError(f"config keys must not start with '{RUN_CONFIG_PREFIX}': {', '.join(clash)}")
    return {**config, **{RUN_CONFIG_PREFIX + k: v for k, v in run_config.items()}}


def split_run_config(config: Mapping[str, object]) -> tuple[dict[str, object], dict[str, object]]:
    """(the config without the run config, the run config carried in it: {} when none)."""
    n = len(RUN_CONFIG_PREFIX)
    run = {k[n:]: v for k, v in config.items() if k.startswith(RUN_CONFIG_PREFIX)}
    rest = {k: v for k, v in config.items() if not k.startswith(RUN_CONFIG_PREFIX)}
    return rest, run


def encode_counts(counts: list[int]) -> str:
    """Class counts as a scalar (get_properties answers scalars only): "12,0,7"."""
    return ",".join(str(int(c)) for c in counts)


def decode_counts(text: str) -> list[int]:
    try:
        return [int(c) for c in str(text).split(",")] if str(text) else []
    except ValueError:
        raise ValueError(f"class counts must be comma-separated integers, got {text!r}") from None
