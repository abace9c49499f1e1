"""Where the in-process engine's overhead goes: the digits job with the learning taken out.

The client's local training and its two local evaluations are replaced by stubs (in the ClientApp's
trainer and in the plain loop alike; the training stub moves one tensor by 1e-3, so updates differ from
the global model as real ones do), so what remains per round is everything *but* learning: in the
plain loop sampling, model loading, parameter copies, the shuffling generator, averaging and the
server's global evaluation; in the engine additionally messages, records, copies, the ClientApp glue,
update validation, results and checkpoints. The difference is the engine's overhead per round in CPU
time (best of ``--repeats``). A cProfile run (CPU clock) of the engine then splits its time by the code
it is spent in (this package's engines/, the ClientApp, records, the strategy and round driver, the
results writer, Flower, torch, numpy); profiling inflates Python-heavy code, so the split is read as
shares, applied to the measured unprofiled total.

    python -m benchmarks.bench_engine_profile [--dataset digits] [--rounds 30] [--repeats 3]
"""

from __future__ import annotations

import contextlib
import cProfile
import os
import pstats
import tempfile
import time
from types import SimpleNamespace
from typing import Callable, Iterator

os.environ.setdefault("OMP_NUM_THREADS", "1")

import torch  # noqa: E402

# (label, path fragment, function): inclusive CPU of these calls in the profiled engine run. They nest
# (the ClientApp call contains the pool, records and trainer lines), so they are read one by one.
ENTRIES = (("ClientApp call (all client-side work)", "clientapp/client_app.py", "__call__"),
           ("  model pool: get + strict load + check", "client_app/model_pool.py", None),
           ("  run config lookup", "client_app/app.py", "_config"),
           ("  client data lookup", "client_app/app.py", "load_client_data"),
           ("  trainer: stubbed learning + reply parameters", "client_app/trainers/base.py", "run"),
           ("boundary copies (engine)", "engines/copying.py", None),
           ("parameters -> records (both sides)", "flcore/records.py", "params_to_record"),
           ("records -> parameters (both sides)", "flcore/records.py", "record_views"),
           ("Flower: Message construction (both sides)", "flwr/app/message/message.py", "__init__"),
           ("Flower: per-item record checks (both sides)", "flwr/app/message/typeddict.py", "__setitem__"),
           ("server: messages (train_content)", "strategies/", "train_content"),
           ("server: collect + validate updates", "strategies/", "collect_updates"),
           ("  update checks and norms (strategies/update_screen.py)", "strategies/update_screen.py", "check_update"),
           ("server: aggregate", "strategies/", "aggregate"),
           ("method lookup (flcore/registry.get_method)", "flcore/registry.py", "get_method"),
           ("results.json rows + writes", "server_app/results.py", "add_round"),
           ("checkpoints", "server_app/checkpoint.py", "save_checkpoint"))


def stub_learning() -> None:
    """Local training and evaluation do nothing (in the ClientApp's trainer and in the plain loop)."""
    import benchmarks.plain_loop as plain
    import client_app.trainers.base as base

    def no_train(model, *args, **kwargs):
        # one tiny step on one tensor, so that updates are not exactly the global model: with all-zero updates
        # the relative norm screen cannot be settled by its cheap bounds and computes exact norms, a cost a
        # real run does not have
        with torch.no_grad():
            next(model.parameters()).add_(1e-3)
        return SimpleNamespace(mean_loss=0.0, steps=1, num_examples=0, loss_sum=0.0, extra={})

    def no_eval(*args, **kwargs):
        return 0.0, 0.0

    base.local_train, base.evaluate = no_train, no_eval
    plain.local_train = no_train
    plain.evaluate = no_eval  # (the server's global evaluation is stubbed in both as well)
    import server_app.runner as runner
    if hasattr(runner, "evaluate"):
        runner.evaluate = no_eval


def cpu_timed(fn, record: Callable[[float], None]):
    """``fn`` that passes the CPU seconds of each call to ``record``."""
    def timed(*a, **k):
        t = time.process_time()
        try:
            return fn(*a, **k)
        finally:
            record(time.process_time() - t)
    return timed


class ClientSideClock:
    """CPU time of the engine's client side outside the learning: every ``engines.grid.handle`` call (copies,
    ClientApp glue, records, model pool, client state) minus the trainer's ``local_train`` and ``evaluate``
    calls inside it. Installed for the engine runs of both the real and the stubbed measurements."""

    def __init__(self) -> None:
        self.handle = self.learning = 0.0

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        import client_app.trainers.base as base
        import engines.grid as grid

        saved = {(grid, "handle"): grid.handle, (base, "local_train"): base.local_train,
                 (base, "evaluate"): base.evaluate}
        grid.handle = self._timed(grid.handle, "handle")
        base.local_train = self._timed(base.local_train, "learning")
        base.evaluate = self._timed(base.evaluate, "learning")
        try:
            yield
        finally:
            for (mod, name), fn in saved.items():
                setattr(mod, name, fn)

    def _timed(self, fn, field: str):
        return cpu_timed(fn, lambda seconds: setattr(self, field, getattr(self, field) + seconds))

    def outside_learning(self) -> float:
        return self.handle - self.learning


# (label, module, attribute): client-side steps timed per call in the engine run with real learning and with
# the learning stubbed (:class:`StepClocks`). The last one is shared with the plain loop.
STEPS = (("engine: boundary copies (message in, reply out)", "engines.delivery", "copy_message"),
         ("ClientApp: received arrays as views", "client_app.app", "record_views"),
         ("ClientApp: model from the pool + weights loaded", "client_app.app", "_model"),
         ("trainer: reply parameters (model views)", "client_app.trainers.base:Trainer", "reply_params"),
         ("ClientApp: reply arrays encoded", "client_app.app", "params_to_record"),
         ("shuffling generator (the plain loop runs it too)", "client_app.app", "_generator"))


class StepClocks:
    """CPU time per call of the :data:`STEPS` (the model pool's ``give_back`` is not wrapped: it counts the
    references to the model, and a wrapper's would make it refuse every model)."""

    def __init__(self) -> None:
        self.seconds = {label: 0.0 for label, _, _ in STEPS}
        self.calls = {label: 0 for label, _, _ in STEPS}

    @staticmethod
    def _owner(path: str):
        import importlib

        module, _, cls = path.partition(":")
        owner = importlib.import_module(module)
        return getattr(owner, cls) if cls else owner

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        saved = []
        for label, path, attr in STEPS:
            owner = self._owner(path)
            saved.append((owner, attr, owner.__dict__[attr]))
            setattr(owner, attr, self._timed(owner.__dict__[attr], label))
        try:
            yield
        finally:
            for owner, attr, fn in saved:
                setattr(owner, attr, fn)

    def _timed(self, fn, label: str):
        def record(seconds: float) -> None:
            self.seconds[label] += seconds
            self.calls[label] += 1
        return cpu_timed(fn, record)

    def per_call_us(self) -> dict[str, float]:
        return {k: self.seconds[k] / self.calls[k] * 1e6 for k in self.seconds if self.calls[k]}


def real_learning(repeats: int, plain, engine) -> dict[str, list[float]]:
    """The same two runs with real learning: CPU per round, the part of it spent in the local training
    (``local_train``, timed in the plain loop and in the ClientApp's trainer alike) and, for the engine, its
    client side outside the learning (:class:`ClientSideClock`)."""
    import benchmarks.plain_loop as plain_loop
    import client_app.trainers.base as base

    spent = [0.0]
    originals = {mod: mod.local_train for mod in (plain_loop, base)}

    def timed(original):
        return cpu_timed(original, lambda seconds: spent.__setitem__(0, spent[0] + seconds))

    out: dict[str, list[float]] = {f"{v}_{k}": [] for v in ("plain", "engine")
                                   for k in ("cpu_per_round_s", "train_per_round_s")}
    out["engine_client_side_per_round_s"] = []
    for mod, original in originals.items():
        mod.local_train = timed(original)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_profile_real_") as tmp:
            for _ in range(repeats):
                for name, fn in (("plain", plain), ("engine", engine)):
                    clock = ClientSideClock()
                    marks: list[tuple[float, float, float]] = []
                    with clock.installed() if name == "engine" else contextlib.nullcontext():
                        fn(lambda marks=marks, clock=clock: marks.append((time.process_time(), spent[0], clock.outside_learning())),
                           tmp)
                    n = len(marks) - 1
                    out[f"{name}_cpu_per_round_s"].append((marks[-1][0] - marks[0][0]) / n)
                    out[f"{name}_train_per_round_s"].append((marks[-1][1] - marks[0][1]) / n)
                    if name == "engine":
                        out["engine_client_side_per_round_s"].append((marks[-1][2] - marks[0][2]) / n)
    finally:
        for mod, original in originals.items():
            mod.local_train = original
    return out


def per_round_cpu(fn, clock=time.process_time) -> float:
    """Mean of ``clock`` per round between the first and the last round end."""
    ends: list[float] = []
    fn(lambda: ends.append(clock()))
    return (ends[-1] - ends[0]) / (len(ends) - 1)


PROBE_CALLS = 300


def cold_probe(dataset: str, calls: int = PROBE_CALLS) -> dict[str, float]:
    """Microseconds of one small piece of Python (the ClientApp's shuffling-generator setup, which the plain
    loop runs too) right after each of a few operations on one client's data: what a step that follows a
    local training pays, against one that follows an evaluation, one batch's forward and backward pass, a
    stream of 4 MiB of data through the caches, or nothing."""
    import numpy as np
    import torch.nn.functional as F

    from client_app.app import _generator
    from client_app.training import OptimConfig, evaluate, local_train
    from data_partitioning.federated import client_arrays
    from flcore.config import RunConfig, resolve_run_config
    from models import build_model

    cfg = RunConfig.from_dict(resolve_run_config({"dataset": dataset}))
    arr = client_arrays(cfg, 0, 10)
    x, y = torch.as_tensor(arr.x_train), torch.as_tensor(arr.y_train)
    model = build_model(cfg, tuple(x.shape[1:]), arr.num_classes)
    optim = OptimConfig(lr=cfg.lr, epochs=cfg.local_epochs, batch_size=cfg.batch_size, momentum=cfg.momentum,
                        weight_decay=cfg.weight_decay, max_steps=cfg.max_local_steps)
    stream = np.zeros(4 * 2 ** 20 // 8)

    def forward_backward() -> None:
        model.zero_grad(set_to_none=True)
        F.cross_entropy(model(x[:cfg.batch_size]), y[:cfg.batch_size]).backward()

    before = {"nothing": lambda: None,
              "a local training (one client, one epoch)": lambda: local_train(
                  model, x, y, optim, generator=torch.Generator().manual_seed(0)),
              "an evaluation of the client's data": lambda: evaluate(model, x, y),
              "one forward + backward pass of one batch": forward_backward,
              "streaming 4 MiB of data (read + write)": lambda: np.add(stream, 1.0, out=stream),
              "nothing (again)": lambda: None}
    out = {}
    for label, op in before.items():
        op()
        total = 0.0
        for i in range(calls):
            op()
            t = time.perf_counter()
            _generator(cfg, 1, i, "train")
            total += time.perf_counter() - t
        out[label] = total / calls * 1e6
    return out


def main() -> None:
    from benchmarks.bench_overhead import workload
    from benchmarks.harness import loadavg, machine, parser, write_result
    from benchmarks.plain_loop import plain_fedavg
    from engines.local import run_local

    ap = parser(__doc__)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--name", default="engine_profile")
    args = ap.parse_args()
    torch.set_num_threads(1)
    started = machine()  # (the load average at the start)

    def engine(tick, tmp):
        import server_app.runner as runner

        cfg = {**workload(args.rounds, tmp, args.dataset, 0), "overwrite": True}
        with runner.observe_lines(lambda text: (tick() if text.startswith("[round ") else None), echo=False):
            run_local(cfg, args.clients)

    def plain(tick, tmp):
        plain_fedavg(workload(args.rounds, tmp, args.dataset, 0), args.clients, on_round=lambda r, t: tick())

    probe = cold_probe(args.dataset)  # (before any stubbing)
    real = real_learning(args.repeats, plain, engine)
    steps = {}
    with tempfile.TemporaryDirectory(prefix="bench_profile_steps_") as tmp:
        for mode in ("real", "stubbed"):
            if mode == "stubbed":
                stub_learning()
            clocks = StepClocks()
            with clocks.installed():
                engine(lambda: None, tmp)
            steps[mode] = clocks.per_call_us()
    plain_s, engine_s, client_s = [], [], []
    with tempfile.TemporaryDirectory(prefix="bench_profile_") as tmp:
        for _ in range(args.repeats):
            plain_s.append(per_round_cpu(lambda tick: plain(tick, tmp)))
            clock = ClientSideClock()
            with clock.installed():
                client_s.append(per_round_cpu(lambda tick: engine(tick, tmp), clock.outside_learning))
            engine_s.append(per_round_cpu(lambda tick: engine(tick, tmp)))
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        engine(lambda: None, tmp)
        prof.disable()
    stats = pstats.Stats(prof).stats  # (file, line, fn) -> (cc, nc, tottime, cumtime, callers)
    run_total = max(v[3] for v in stats.values())
    profile = {}
    for label, path, fn in ENTRIES:
        if fn is None:  # every function of that file called from outside it: sum their inclusive times
            cum = sum(v[3] for (p, _, name), v in stats.items()
                      if path in p.replace("\\", "/") and not any(path in c[0] for c in v[4]))
        else:
            cum = sum(v[3] for (p, _, name), v in stats.items() if path in p.replace("\\", "/") and name == fn
                      and not any(path in c[0] and c[2] == fn for c in v[4]))
        profile[label] = cum / run_total
    overhead = min(engine_s) - min(plain_s)
    out = {"machine": started, "args": vars(args), "plain_cpu_per_round_s": plain_s, "engine_cpu_per_round_s": engine_s,
           "overhead_cpu_per_round_s": overhead, "overhead_per_client_us": overhead / args.clients * 1e6,
           "profile_share_of_run": profile, "real": real,
           "engine_client_side_stubbed_per_round_s": client_s, "steps_us_per_call": steps, "cold_probe_us": probe,
           "cold_probe_calls": PROBE_CALLS, "loadavg_after": loadavg()}
    print(f"learning stubbed, CPU per round (best of {args.repeats}): plain {min(plain_s) * 1e3:.2f} ms, engine "
          f"{min(engine_s) * 1e3:.2f} ms -> engine overhead {overhead * 1e3:.2f} ms per round "
          f"({out['overhead_per_client_us']:.0f} us per client)")
    for k, v in profile.items():
        print(f"  {v * 100:5.1f}%  {k}")
    print(f"real learning, CPU per round (best of {args.repeats}): plain {min(real['plain_cpu_per_round_s']) * 1e3:.2f} "
          f"ms (local training {min(real['plain_train_per_round_s']) * 1e3:.2f}), engine "
          f"{min(real['engine_cpu_per_round_s']) * 1e3:.2f} ms (local training {min(real['engine_train_per_round_s']) * 1e3:.2f})")
    print(f"engine client side outside the learning, CPU per round (best of {args.repeats}): real learning "
          f"{min(real['engine_client_side_per_round_s']) * 1e3:.2f} ms, stubbed {min(client_s) * 1e3:.2f} ms")
    for label, us in probe.items():
        print(f"  the shuffling generator's set-up after {label}: {us:.1f} us")
    for label in steps["real"]:
        print(f"  {label}: {steps['stubbed'][label]:.1f} us per call stubbed, {steps['real'][label]:.1f} real")
    print(f"wrote {write_result(args.name, out)}")


if __name__ == "__main__":
    main()
