"""A method declaration (:class:`MethodDecl`) and its payload keys (:class:`Payload`): data only, the types every
declaration module of flcore/methods imports. The list of declarations is flcore/registry.py's (which imports the
declaration modules, so they import this module, not the registry: no import cycle)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from flcore.schema import Section


@dataclass(frozen=True)
class Payload:
    """What a method adds to the base protocol (docs/PROTOCOL.md), by name.

    config:        keys the server adds to a client's "config" ConfigRecord (per-client values).
    records:       extra records in server -> client messages (a name ending in "." is a prefix).
    metrics:       extra keys in the reply's "metrics" MetricRecord.
    reply_records: extra records in client -> server replies.
    actions:       message types the strategy sends besides "query" and "evaluate".
    state:         client-state entries the trainer keeps between rounds (context.state / state-dir).
    """

    config: tuple[str, ...] = ()
    records: tuple[str, ...] = ()
    metrics: tuple[str, ...] = ()
    reply_records: tuple[str, ...] = ()
    actions: tuple[str, ...] = ("train",)
    state: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodDecl:
    """How a method is assembled (see the module docstring).

    model_hook: ``"module:fn"`` with ``fn(model: FLModel, cfg: RunConfig) -> None`` adding the method's
                federated modules (LRA neck, projection head, discriminator); it lives in ``models/`` and runs
                identically on the server (initial model, central evaluation) and on every client.
    head:       head forced by the method ("etf" for fedetf), else the run config's ``head``.
    check_federation: ``fn(cfg, num_nodes) -> None`` raising ConfigError (naming the key) when the method cannot
                run with that many nodes (FedUFO: a discriminator output per client); called by the pre-flight
                checks wherever the number of nodes is known (server_app/preflight.py), before any engine starts.
                A plain function of the declaration module: it needs only the parsed config (no torch).
    recipe:     common-key values the method's own recipe sets (a ``-code`` variant: its authors' optimizer,
                epochs, batch): applied like a preset under it, by flcore/presets.py's rule (declared default <
                recipe < preset < what the user sets), and recorded in the run config like any other value.
                Each value's source goes in ``recipe_sources`` (key -> file and function, or paper section).
    precisions: the run-config ``precision`` values the method takes (models/numerics.py); another is refused
                with ``precision_reason``. fp16-mixed scales the loss of the one local loop only, so a method
                whose client runs backward passes of its own leaves it out.
    """

    name: str
    paper: str
    strategy: str
    trainer: str
    config: type[Section] | None = None
    model_hook: str | None = None
    head: str | None = None
    payload: Payload = field(default_factory=Payload)
    description: str = ""
    check_federation: Callable[[Any, int], None] | None = None  # (RunConfig, nodes): config imports this module
    recipe: Mapping[str, Any] = field(default_factory=dict)
    recipe_sources: Mapping[str, str] = field(default_factory=dict)
    precisions: tuple[str, ...] = ("fp32", "bf16-mixed", "fp16-mixed")
    precision_reason: str = ""

    def precision_refusal(self, precision: str) -> str:
        """Why the method refuses run-config ``precision`` ('' when it takes it)."""
        if precision in self.precisions:
            return ""
        return (f"method '{self.name}' does not take precision = '{precision}' ({self.precision_reason}); it takes "
                f"{', '.join(self.precisions)}")

    def __post_init__(self) -> None:
        if "fp32" not in self.precisions or (len(self.precisions) < 3 and not self.precision_reason):
            raise ValueError(f"method '{self.name}': precisions must include fp32, and a method that refuses one "
                             "says why (precision_reason)")
        missing = [k for k in self.recipe if k not in self.recipe_sources]
        if missing:
            raise ValueError(f"method '{self.name}': recipe key(s) {', '.join(missing)} have no source in "
                             "recipe_sources")


NO_FP16 = ("fp32", "bf16-mixed")
OWN_BACKWARD = ("its client runs backward passes outside the one local loop, whose loss alone the fp16 gradient "
                "scaler scales: unscaled fp16 gradients there could underflow")



def own_backward(decls: list[MethodDecl]) -> list[MethodDecl]:
    """``decls`` refusing fp16-mixed: their clients run backward passes outside the one local loop."""
    return [dataclasses.replace(d, precisions=NO_FP16, precision_reason=OWN_BACKWARD) for d in decls]


BASE_TRAINER = "client_app.trainers.base:Trainer"
FEDAVG_STRATEGY = "strategies.methods.fedavg:FedAvgStrategy"
