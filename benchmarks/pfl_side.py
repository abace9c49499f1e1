"""The pfl-research side of bench_pfl: run in a separate environment that has ``pfl`` (apple/pfl-research) and
torch, never this project's dependencies (only numpy, torch and pfl are imported here).

Reads the job bench_pfl exported (each client's train/test arrays, the global test set, the initial
weights, the model), then per repeat runs two variants on the same torch, back to back:

  plain  a plain PyTorch FedAvg loop (the work of benchmarks/plain_loop.py: for every client the global
         model on its local test split, one epoch of minibatch SGD with shuffling, the local model on the
         local test split; weighted average; the global model on the global test set);
  pfl    pfl's FederatedAveraging on its SimulatedBackend with the same work: cohort = every client,
         the same local SGD (pfl's own loop, one epoch, the same batch size and learning rate), user
         evaluation before and after local training on the client's local test split (a small
         FederatedAveraging subclass points pfl's per-user evaluation there), central evaluation on the
         global test set every iteration, central learning rate 1 (plain averaging of the updates).

Prints one JSON document: per-round end times (wall, process CPU) of every variant and repeat.

    <pfl-venv>/bin/python benchmarks/pfl_side.py JOB.npz --rounds 6 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


# ============================================================================ the model (same shapes as models/)
class Net(nn.Module):
    """The project's MLP or ConvNet + linear head, with the ``loss`` / ``metrics`` methods pfl calls."""

    def __init__(self, name: str, in_shape: tuple[int, ...], classes: int) -> None:
        super().__init__()
        c, h, w = in_shape
        if name == "mlp":
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(c * h * w, 200), nn.ReLU(), nn.Linear(200, 200), nn.ReLU())
            dim = 200
        elif name == "convnet":
            conv = nn.Sequential(nn.Conv2d(c, 32, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2),
                                 nn.Conv2d(32, 64, 5, padding=2), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten())
            with torch.no_grad():
                flat = conv(torch.zeros(1, c, h, w)).shape[1]
            self.body = nn.Sequential(conv, nn.Linear(flat, 64), nn.ReLU())
            dim = 64
        else:
            raise ValueError(f"model must be mlp or convnet, got {name!r}")
        self.head = nn.Linear(dim, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))

    def loss(self, x: torch.Tensor, y: torch.Tensor, eval: bool = False) -> torch.Tensor:  # noqa: A002
        self.eval() if eval else self.train()
        return F.cross_entropy(self(x), y)

    @torch.no_grad()
    def metrics(self, x: torch.Tensor, y: torch.Tensor, eval: bool = True) -> dict:  # noqa: A002
        from pfl.metrics import Weighted

        self.eval()
        logits = self(x)
        n = int(x.shape[0])
        return {"loss": Weighted(float(F.cross_entropy(logits, y, reduction="sum")), n),
                "accuracy": Weighted(float((logits.argmax(1) == y).sum()), n)}


def load_job(path: str) -> dict:
    z = np.load(path, allow_pickle=False)
    k = int(z["num_clients"])
    job = {"model": str(z["model"]), "in_shape": tuple(int(v) for v in z["in_shape"]), "classes": int(z["classes"]),
           "lr": float(z["lr"]), "batch_size": int(z["batch_size"]), "seed": int(z["seed"]),
           "init": [torch.from_numpy(z[f"init_{i}"]) for i in range(int(z["num_init"]))],
           "x_test": torch.from_numpy(z["x_test"]), "y_test": torch.from_numpy(z["y_test"]), "clients": []}
    for c in range(k):
        job["clients"].append(tuple(torch.from_numpy(z[f"{part}_{c}"]) for part in ("xtr", "ytr", "xte", "yte")))
    return job


def new_model(job: dict) -> Net:
    torch.manual_seed(job["seed"])
    model = Net(job["model"], job["in_shape"], job["classes"])
    with torch.no_grad():
        for p, v in zip(model.state_dict().values(), job["init"]):
            p.copy_(v)
    return model


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    model.eval()
    logits = model(x)
    return float(F.cross_entropy(logits, y)), float((logits.argmax(1) == y).float().mean())


# ============================================================================ plain
def run_plain(job: dict, rounds: int, on_round) -> list[float]:
    server, client = new_model(job), new_model(job)
    accs = []
    for rnd in range(1, rounds + 1):
        glob = {k: v.clone() for k, v in server.state_dict().items()}
        total, acc_sum = 0, None
        for cid, (xtr, ytr, xte, yte) in enumerate(job["clients"]):
            client.load_state_dict(glob)
            evaluate(client, xte, yte)
            client.train()
            opt = torch.optim.SGD(client.parameters(), lr=job["lr"])
            gen = torch.Generator().manual_seed(job["seed"] * 100003 + rnd * 1009 + cid)
            order = torch.randperm(xtr.shape[0], generator=gen)
            for s in range(0, xtr.shape[0], job["batch_size"]):
                idx = order[s:s + job["batch_size"]]
                loss = F.cross_entropy(client(xtr[idx]), ytr[idx])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            evaluate(client, xte, yte)
            n = int(xtr.shape[0])
            state = client.state_dict()
            acc_sum = {k: v * n for k, v in state.items()} if acc_sum is None else {
                k: acc_sum[k] + state[k] * n for k in acc_sum}
            total += n
        server.load_state_dict({k: v / total for k, v in acc_sum.items()})
        accs.append(evaluate(server, job["x_test"], job["y_test"])[1])
        on_round()
    return accs


# ============================================================================ pfl
def run_pfl(job: dict, rounds: int, on_round) -> list[float]:
    from pfl.aggregate.simulate import SimulatedBackend
    from pfl.algorithm import FederatedAveraging, NNAlgorithmParams
    from pfl.callback.central_evaluation import CentralEvaluationCallback
    from pfl.callback.base import TrainingProcessCallback
    from pfl.data.dataset import Dataset
    from pfl.data.federated_dataset import FederatedDataset
    from pfl.data.sampling import get_user_sampler
    from pfl.hyperparam import NNEvalHyperParams, NNTrainHyperParams
    from pfl.metrics import Metrics
    from pfl.model.pytorch import PyTorchModel

    class LocalTestFedAvg(FederatedAveraging):
        """FedAvg whose per-user evaluation before/after training uses the user's local test split."""

        def simulate_one_user(self, model, user_dataset, central_context):
            test = user_dataset.metadata["test"]
            metrics = model.evaluate(test, lambda n: n + " before", central_context.model_eval_params)
            self._initial_model_state = model.get_parameters(self._initial_model_state)
            statistics, train_metrics = self.train_one_user(self._initial_model_state, model, user_dataset,
                                                            central_context)
            metrics |= train_metrics
            metrics |= model.evaluate(test, lambda n: n + " after", central_context.model_eval_params)
            model.set_parameters(self._initial_model_state)
            return statistics, metrics

    class Clock(TrainingProcessCallback):
        def __init__(self) -> None:
            self.accs: list[float] = []

        def after_central_iteration(self, aggregate_metrics, model, *, central_iteration):
            for name, value in aggregate_metrics:
                if "accuracy" in str(name) and "Central val" in str(name):
                    self.accs.append(float(value.overall_value if hasattr(value, "overall_value") else value))
            on_round()
            return False, Metrics()

    users = {str(c): Dataset(raw_data=[xtr, ytr], user_id=str(c), metadata={"test": Dataset(raw_data=[xte, yte])})
             for c, (xtr, ytr, xte, yte) in enumerate(job["clients"])}
    sampler = get_user_sampler("minimize_reuse", list(users))
    fed = FederatedDataset(lambda uid: users[uid], sampler)
    net = new_model(job)
    model = PyTorchModel(model=net, local_optimizer_create=torch.optim.SGD,
                         central_optimizer=torch.optim.SGD(net.parameters(), lr=1.0))
    backend = SimulatedBackend(training_data=fed, val_data=None)
    clock = Clock()
    algo = LocalTestFedAvg()
    algo.run(algorithm_params=NNAlgorithmParams(central_num_iterations=rounds, evaluation_frequency=1,
                                                train_cohort_size=len(users), val_cohort_size=0),
             backend=backend, model=model,
             model_train_params=NNTrainHyperParams(local_num_epochs=1, local_learning_rate=job["lr"],
                                                   local_batch_size=job["batch_size"]),
             model_eval_params=NNEvalHyperParams(local_batch_size=512),
             callbacks=[CentralEvaluationCallback(Dataset(raw_data=[job["x_test"], job["y_test"]]),
                                                  model_eval_params=NNEvalHyperParams(local_batch_size=512),
                                                  frequency=1), clock])
    return clock.accs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("job")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    torch.set_num_threads(1)
    t_import = time.time()
    import pfl  # noqa: F401 - its import is part of pfl's start-up

    import_s = time.time() - t_import
    job = load_job(args.job)
    out = {"torch": torch.__version__, "pfl_import_s": import_s, "repeats": []}
    for k in range(args.repeats):
        rep = {}
        for name in (("plain", "pfl") if k % 2 == 0 else ("pfl", "plain")):
            ends: list[tuple[float, float]] = []
            t0, c0 = time.time(), time.process_time()
            fn = run_plain if name == "plain" else run_pfl
            accs = fn(job, args.rounds, lambda ends=ends: ends.append((time.time(), time.process_time())))
            rep[name] = {"t_start": t0, "cpu_start": c0, "round_ends": [e[0] for e in ends],
                         "round_end_cpu": [e[1] for e in ends], "accuracy": accs}
        rep["loadavg_after"] = list(os.getloadavg())
        out["repeats"].append(rep)
        print(f"repeat {k + 1}: " + ", ".join(
            f"{n} {(r['round_ends'][-1] - r['round_ends'][0]) / max(len(r['round_ends']) - 1, 1):.3f}s/round"
            for n, r in rep.items() if n != "loadavg_after"), file=sys.stderr, flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
