"""fedbr-code (issue 40): FedBR as the authors' public code runs it (LINs-lab/FedBR). Its common values are the
method's recipe (MethodDecl.recipe), recorded in the run config of a run that sets nothing else; its own keys
live in fedbr-code.*, each default that differs from fedbr.* naming the code's file and function."""

from __future__ import annotations

import json
from dataclasses import fields

import pytest
import torch

from flcore.config import RunConfig, resolve_run_config
from flcore.methods.fedbr import CODE_RECIPE, FedBRCodeConfig, FedBRConfig, br_config
from flcore.registry import get_method
from models import build_model

RECIPE = {"lr": 1e-3, "momentum": 0.0, "weight-decay": 0.0, "batch-size": 64, "local-epochs": 50,
          "max-local-steps": 50, "model": "domainbed-cnn"}


def test_the_recipe_is_the_authors_rotatedmnist_hyperparameters_each_with_its_source():
    decl = get_method("fedbr-code")
    assert dict(decl.recipe) == RECIPE == CODE_RECIPE
    for key, source in decl.recipe_sources.items():
        assert "LINs-lab/FedBR" in source and (".py" in source or "README" in source), key
    assert not get_method("fedbr").recipe  # the paper's method has no recipe of its own


@pytest.mark.slow
def test_a_fedbr_code_run_with_nothing_else_set_records_the_recipe(tmp_path):
    """A real federation (one round, but the recipe's 50 local steps of the DomainBed CNN: 7 s, so slow tier):
    only the dataset, rounds and output folder set; results.json's run config shows the recipe."""
    from server_app.runner import run_federation
    from tests.fakegrid import FakeGrid

    cfg = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code", "dataset": "digits",
                                                  "num-server-rounds": 1, "out-dir": str(tmp_path / "run")}))
    run_federation(FakeGrid(2), cfg)
    recorded = json.loads((tmp_path / "run" / "results.json").read_text())["run_config"]
    assert {k: recorded[k] for k in RECIPE} == RECIPE
    assert recorded["fedbr-code.mixture-partners"] == "batch" and recorded["fedbr-code.global-features"] == "round"


def test_the_recipe_is_what_a_fedbr_code_config_resolves_to_and_the_users_values_win():
    """The resolved run config of a fedbr-code run that sets nothing is the recipe; the paper's fedbr keeps the
    library defaults; a value the user sets wins over the recipe."""
    alone = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code"})).to_dict()  # truly nothing else
    assert {k: alone[k] for k in RECIPE} == RECIPE and alone["preset-applied"] is True
    paper = resolve_run_config({"method": "fedbr"})
    assert (paper["lr"], paper["model"]) != (1e-3, "domainbed-cnn")
    user = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code", "lr": 0.03}))
    assert (user.lr, user.batch_size) == (0.03, 64)  # what the user sets wins over the recipe


def test_every_code_default_that_differs_names_the_code():
    paper, code = FedBRConfig(), FedBRCodeConfig()
    differs = [f.name for f in fields(FedBRCodeConfig) if getattr(paper, f.name) != getattr(code, f.name)]
    assert sorted(differs) == ["global_features", "mixture_partners", "rsm_scope"]
    docs = {s.key: s.doc for s in FedBRCodeConfig.specs()}
    for name in differs:
        assert "LINs-lab/FedBR" in docs[FedBRCodeConfig.key_of(name)], name
    assert all(s.old is None for s in FedBRCodeConfig.specs())  # old flat names belong to fedbr.*


def test_the_code_variant_reads_its_own_section():
    cfg = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code", "fedbr-code.mu": 0.25, "fedbr.mu": 2.0}))
    assert isinstance(br_config(cfg), FedBRCodeConfig) and br_config(cfg).mu == 0.25
    paper = RunConfig.from_dict(resolve_run_config({"method": "fedbr", "fedbr-code.mu": 0.25}))
    assert type(br_config(paper)) is FedBRConfig and br_config(paper).mu == 0.5


def test_the_domainbed_cnn_is_the_authors_mnist_featurizer():
    """networks.py MNIST_CNN: convs 64, 128 (stride 2), 128, 128 with ReLU then GroupNorm(8), mean-pooled to 128;
    P_theta on it is 128 -> 256 -> 256 -> 128 (networks.py MLP of width 2d)."""
    cfg = RunConfig.from_dict(resolve_run_config({"method": "fedbr-code", "dataset": "mnist-5k"}))
    model = build_model(cfg, (1, 28, 28), 10)
    convs = [m for m in model.backbone.modules() if isinstance(m, torch.nn.Conv2d)]
    assert [(c.in_channels, c.out_channels, c.stride[0]) for c in convs] == [(1, 64, 1), (64, 128, 2), (128, 128, 1),
                                                                             (128, 128, 1)]
    assert all(m.num_groups == 8 for m in model.backbone.modules() if isinstance(m, torch.nn.GroupNorm))
    assert model.feature_dim == 128 and model.features(torch.zeros(2, 1, 28, 28)).shape == (2, 128)
    linears = [m for m in model.extras["proj"] if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(128, 256), (256, 256), (256, 128)]
