"""Paper presets (flcore/paper_presets.py): the table's rules, the papers' federations, paper-scale partitions,
the `noniid-fl methods` listing, docs/PRESETS.md, and a dry run of every preset on tiny torchvision stand-ins:
`noniid-fl run --check`, then one real round on the in-process engine, shrunk (SHRINK below)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from cli.main import main
from data_partitioning import federated
from data_partitioning.datasets import TORCHVISION_FILES, Pool, dataset_shape, system_copy
from flcore.config import RunConfig, all_specs, resolve_run_config
from flcore.presets import presets
from flcore.presets_doc import DOC, assignments, kind_of, per_round, render
from flcore.schema import coerce
from models import build_model
from tests.torchvision_fixtures import skip_cifar_md5, write_data_root

PRESETS = presets()
NAMES = list(PRESETS)
# The papers' federations: (K clients, clients trained per round). FedRANE Sec. 4.1: K = 20 (how many train per
# round is not stated; all of them is our choice); FedBC App. E: 30 devices, 10 per round; FedUFO Sec. 4.1.1: 100
# clients, C = 0.1; FedBR Table 1: 10 clients, all of them (authors' code); neural-collapse FL Sec. 5.1: 100, 10%.
FEDERATION = {"fedrane": (20, 20), "fedbc": (30, 10), "fedufo": (100, 10), "fedbr": (10, 10), "fedetf": (100, 10)}
# Issue 19: a preset sets the optimizer, lr, E, B, participation, rounds, model, dataset and partition ...
REQUIRED = {"method", "dataset", "partition", "model", "lr", "momentum", "weight-decay", "local-epochs",
            "batch-size", "fraction-train", "num-server-rounds", "local-test-fraction"}
PARTITION_KEYS = {"dirichlet": {"dirichlet-alpha"}, "shards": {"shards-per-client"},
                  "classes": {"classes-per-client", "samples-per-class"}, "power-law": set()}
# ... and the method's own knobs (its objective's hyper-parameters; solver tolerances keep their defaults).
KNOBS = {"fedrane": {"fedrane.lra-tau", "fedrane.lra-lambda-g", "fedrane.lra-lambda-cd", "fedrane.lra-graph",
                     "fedrane.lra-cut", "fedrane.lra-steps", "fedrane.gne-scale"},
         "fedbc": {"fedbc.eta-lambda", "fedbc.eta-gamma", "fedbc.lambda-momentum", "fedbc.lambda-init",
                   "fedbc.gamma-init", "fedbc.lambda-max"},
         "fedufo": {"fedufo.num-clients", "fedufo.cgl-lambda", "fedufo.losses", "fedufo.dynamic-sampling",
                    "fedufo.stage-one-fraction", "fedufo.posterior-init"},
         "fedbr": {"fedbr.mu", "fedbr.lambda", "fedbr.tau1", "fedbr.tau2", "fedbr.pseudo", "fedbr.pseudo-size",
                   "fedbr.pseudo-refresh", "fedbr.weighting"},
         "fedetf": {"fedetf.alpha", "fedetf.warmup-fraction", "fedetf.gmv-weighting", "fedetf.aggregation", "head",
                    "etf-scale"},
         "fedprox": {"fedprox.mu"}, "qfedavg": {"qfedavg.q"}, "scaffold": {"scaffold.option", "scaffold.server-lr"},
         "perfedavg": {"perfedavg.alpha", "perfedavg.variant"},
         "pfedme": {"pfedme.lamda", "pfedme.k-steps", "pfedme.personal-lr", "pfedme.beta"},
         "fedmeta": {"fedmeta.fraction", "fedmeta.epochs", "fedmeta.lr", "fedmeta.batch-size", "fedmeta.local-data"}}


def family(name: str) -> str:
    return name.split("-")[0]


@pytest.mark.parametrize("name", NAMES)
def test_a_preset_sets_every_issue_key_with_a_source_or_a_reason(name):
    p = PRESETS[name]
    specs = all_specs()
    assert family(name) in FEDERATION and p.scale == "paper" and len(p.source) > 40
    assert set(p.values) <= set(specs), set(p.values) - set(specs)
    method = p.values["method"]
    need = REQUIRED | PARTITION_KEYS[p.values["partition"]] | KNOBS[method]
    if p.values["partition"] == "power-law" and p.values["dataset"] != "synthetic":
        need |= {"power-law-exponent"}
    assert need <= set(p.values), f"{name} lacks {sorted(need - set(p.values))}"
    assert set(p.choices) <= set(p.values), "a reason for a value the preset does not set"
    assert all(len(why) > 15 for why in p.choices.values())
    # a preset of another method than the paper's is a baseline of that paper's comparison, named after it
    assert method == family(name) or name.endswith(f"-{method}"), name


@pytest.mark.parametrize("name", NAMES)
def test_the_federation_is_the_papers(name):
    p = PRESETS[name]
    k, per = FEDERATION[family(name)]
    assert p.num_supernodes == k and per_round(p) == per


@pytest.mark.parametrize("name", NAMES)
def test_applying_a_preset_gives_its_values_and_explicit_values_win(name):
    p = PRESETS[name]
    specs = all_specs()
    got = RunConfig.from_dict({"preset": name}).to_dict()
    for key, value in p.values.items():
        assert got[key] == coerce(key, value, specs[key].type), key
    own = RunConfig.from_dict(resolve_run_config({"preset": name, "lr": 0.123, "num-server-rounds": 7}))
    assert own.lr == 0.123 and own.num_server_rounds == 7 and own.batch_size == p.values["batch-size"]


def test_an_explicit_library_default_wins_where_the_overrides_are_known():
    # fedrane presets: plain SGD; 0.9 is the library default, asked for explicitly
    cfg = RunConfig.from_dict(resolve_run_config({"preset": "fedrane-fmnist-dir01", "momentum": 0.9}))
    assert cfg.momentum == 0.9 and cfg.batch_size == PRESETS["fedrane-fmnist-dir01"].values["batch-size"]
    # the paper's FedAvg baseline in a method paper's setting: method='fedavg' is the default value
    base = RunConfig.from_dict(resolve_run_config({"preset": "fedufo-mnist-shards", "method": "fedavg"}))
    assert base.method == "fedavg" and base.local_epochs == PRESETS["fedufo-mnist-shards"].values["local-epochs"]


# ---------------------------------------------------------------------------------- paper-scale partitions
# Training-set class counts of the torchvision sets (MNIST's are uneven).
CLASS_COUNTS = {"mnist": [5923, 6742, 5958, 6131, 5842, 5421, 5918, 6265, 5851, 5949], "fmnist": [6000] * 10,
                "emnist-letters": [4800] * 26, "cifar10": [5000] * 10, "cifar100": [500] * 100}


@pytest.mark.parametrize("name", [n for n in NAMES if PRESETS[n].values["dataset"] != "synthetic"])
def test_the_partition_holds_at_paper_scale(name, monkeypatch):
    """The preset's partition over the full training set (labels with the real class counts; rotated-mnist:
    the real offline pool) and the paper's K clients: every client gets data, and the shapes the papers state."""
    p = PRESETS[name]
    cfg = RunConfig.from_dict({"preset": name})
    if cfg.dataset in CLASS_COUNTS:
        labels = np.repeat(np.arange(len(CLASS_COUNTS[cfg.dataset])), CLASS_COUNTS[cfg.dataset])
        shape = dataset_shape(cfg.dataset)[0]
        fake = Pool(cfg.dataset, np.zeros((len(labels), 1), np.float32), labels, np.zeros((1, 1), np.float32),
                    labels[:1], len(CLASS_COUNTS[cfg.dataset]), shape)
        monkeypatch.setattr(federated, "load_pool", lambda *args, **kw: fake)
    federated._partition.cache_clear()
    try:
        parts = federated.partition_indices(cfg, p.num_supernodes)
        labels = federated.load_pool(cfg.dataset, cfg.seed, cfg.global_test_fraction).y_train
    finally:
        federated._partition.cache_clear()
    sizes = np.array([len(part) for part in parts])
    everything = np.concatenate(parts)
    assert len(parts) == p.num_supernodes and sizes.min() >= max(cfg.min_partition_size, 1)
    assert len(np.unique(everything)) == len(everything)  # no sample on two clients
    if cfg.partition == "shards":  # FedUFO: 200 shards of N/200 (MNIST: 300), 2 per client
        assert set(sizes) == {2 * len(labels) // 200} and len(everything) == len(labels)
    elif cfg.partition == "classes":  # neural-collapse FL: exactly the classes and samples per class
        for part in parts:
            classes, counts = np.unique(labels[part], return_counts=True)
            assert len(classes) == cfg.classes_per_client and set(counts) == {cfg.samples_per_class}
    elif cfg.partition == "power-law":  # FedBC: a head client with far more data than the tail
        assert sizes.max() > 20 * sizes.min()
    else:
        assert len(everything) == len(labels)


# --------------------------------------------------------------------------------------- listing and doc
def test_methods_lists_every_preset_with_its_paper_setting_and_values(capsys):
    assert main(["methods"]) == 0
    out = capsys.readouterr().out
    block = out[out.index("paper presets"):]
    lines = block.splitlines()
    for name, p in PRESETS.items():
        assert p.paper in block
        at = next(i for i, line in enumerate(lines) if line.split()[:1] == [name])
        assert p.setting in lines[at]
        words = []
        for line in lines[at + 1:]:  # the values, wrapped on lines indented by 6
            if not line.startswith(" " * 6):
                break
            words += line.split()
        assert words[:2] == ["--nodes", str(p.num_supernodes)] and words[2:] == assignments(p)
    # marks: FedRANE's momentum is our choice (the paper names plain SGD), its lr is stated
    fedrane = assignments(PRESETS["fedrane-cifar10-dir01"])
    assert "momentum=0.0*" in fedrane and "lr=0.5" in fedrane
    assert kind_of(PRESETS["fedbr-cifar100"], "model").startswith("stated, not expressible")


def test_presets_doc_is_the_generated_one():
    assert DOC.read_text() == render(), "run: python -m flcore.presets_doc"


# ------------------------------------------------------------------------------------------------ dry runs
# How each preset is shrunk for its one-round run on the stand-in files (20 training images per class, CIFAR-100 5):
# one round, one local step per client (max-local-steps = 1), and fewer clients where the partition allows:
# FedRANE 4 (its resnet18 presets 2), FedBC 6 (2 per round), FedUFO 20 (40 shards of 5 images; 2 per round),
# FedBR 2, FedETF 20 with 1 sample per class (2 per round); FedRANE's inductive evaluation on a support set of 8
# training rows instead of batch-size - 1. Everything else is the preset's.
SHRINK = {"fedrane": (4, {"fedrane.lra-support-size": 8}), "fedbc": (6, {}), "fedufo": (20, {}),
          "fedbr": (2, {}), "fedetf": (20, {"samples-per-class": 1})}
HEAVY = {"resnet18", "vgg11"}


@pytest.fixture(scope="module")
def data_root(tmp_path_factory):
    root = write_data_root(tmp_path_factory.mktemp("tv"))
    for name, files in TORCHVISION_FILES.items():
        assert all((root / f).is_file() for f in files), name
    return root


def _toml(value) -> str:
    return repr(value) if isinstance(value, str) else json.dumps(value)


def shrunk_run(name: str, data_root, out) -> tuple[int, dict, list[str]]:
    """(nodes, the shrinking overrides, the `noniid-fl run` arguments) of preset ``name``'s dry run."""
    p = PRESETS[name]
    nodes, extra = SHRINK[family(name)]
    if p.values["model"] in HEAVY and family(name) == "fedrane":
        nodes = 2
    shrink = {"num-server-rounds": 1, "max-local-steps": 1, **extra}
    words = [f"preset='{name}'", f"data-root='{data_root}'", f"out-dir='{out}'",
             *(f"{k}={_toml(v)}" for k, v in shrink.items())]
    return nodes, shrink, ["--nodes", str(nodes), "-c", " ".join(words)]


@pytest.mark.parametrize("name", NAMES)
def test_a_preset_passes_preflight_on_a_data_root(name, data_root, tmp_path, capsys):
    p = PRESETS[name]
    nodes, _, args = shrunk_run(name, data_root, tmp_path / "run")
    assert main(["run", "--check", *args]) == 0
    ok = f"config ok: {p.values['method']} on {p.values['dataset']}, {nodes} nodes, 1 rounds"
    assert ok in capsys.readouterr().out
    assert not (tmp_path / "run").exists()  # --check runs nothing
    if p.values["dataset"] in TORCHVISION_FILES:  # the same config without the files is refused, naming them,
        empty = tmp_path / "empty"  # unless a packaged copy of the set is installed (fmnist's Debian package)
        empty.mkdir()
        packaged = system_copy(p.values["dataset"]) is not None
        assert main(["run", "--check", *shrunk_run(name, empty, tmp_path / "run")[2]]) == (0 if packaged else 2)
        if not packaged:
            assert f"files are not under data-root '{empty}'" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_a_preset_runs_a_round(name, data_root, tmp_path, monkeypatch):
    skip_cifar_md5(monkeypatch)
    p = PRESETS[name]
    out = tmp_path / "run"
    nodes, shrink, args = shrunk_run(name, data_root, out)
    assert main(["run", *args]) == 0
    doc = json.loads((out / "results.json").read_text())
    specs = all_specs()
    for key, value in p.values.items():
        if key not in shrink:
            assert doc["run_config"][key] == coerce(key, value, specs[key].type), key
    assert doc["run_config"]["preset"] == name and doc["run_config"]["max-local-steps"] == 1
    (row,) = doc["rounds"]
    sampled = min(nodes, max(2, math.ceil(p.values["fraction-train"] * nodes)))  # min-train-nodes = 2
    assert row["num_sampled"] == row["num_updates"] == sampled and row["failures"] == []
    assert 0.0 <= row["global_accuracy"] <= 1.0 and math.isfinite(row["global_loss"])
    assert (row["local_accuracy"] is not None) == (p.values["local-test-fraction"] > 0)  # P-FL only with a split
    if p.values.get("federated-eval-every") == 1:
        assert row["client_accuracy_mean"] is not None
    # the trained model is the preset's architecture (backbone, head and the method's modules)
    cfg = RunConfig.from_dict(resolve_run_config({"preset": name, **shrink}))
    in_shape, num_classes = dataset_shape(cfg.dataset)
    want = {k: tuple(v.shape) for k, v in build_model(cfg, in_shape, num_classes).state_dict().items()}
    got = {k: tuple(v.shape) for k, v in torch.load(out / "final_model.pt", weights_only=False).items()}
    assert got == want
