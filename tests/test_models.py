import pytest
import torch

from flcore.config import RunConfig, resolve_run_config
from models import build_model
from models.networks import BACKBONES


def cfg(**over):
    return RunConfig.from_dict(resolve_run_config(over))


@pytest.mark.parametrize("name,shape,dim", [("logistic", (60,), 60), ("mlp", (1, 8, 8), 200),
                                            ("convnet", (1, 28, 28), 64), ("vgg11", (3, 32, 32), 512),
                                            ("resnet18", (3, 32, 32), 512)])
def test_backbone_feature_shapes(name, shape, dim):
    body, d = BACKBONES[name](shape)
    assert d == dim
    assert body(torch.zeros(2, *shape)).shape == (2, dim)


def test_build_model_logits_features_and_seeded_init():
    c = cfg(dataset="mnist-5k")
    m1, m2 = build_model(c, (1, 28, 28), 10), build_model(c, (1, 28, 28), 10)
    logits, z = m1.forward_features(torch.zeros(3, 1, 28, 28))
    assert logits.shape == (3, 10) and z.shape == (3, 64)
    assert all(torch.equal(a, b) for a, b in zip(m1.state_dict().values(), m2.state_dict().values()))
    m3 = build_model(c.replace(seed=1), (1, 28, 28), 10)
    assert not torch.equal(m1.head.weight, m3.head.weight)


def test_etf_head_is_a_buffer_not_a_parameter():
    m = build_model(cfg(dataset="mnist-5k", head="etf"), (1, 28, 28), 10)
    names = [n for n, _ in m.named_parameters()]
    assert not any(n.startswith("head.") for n in names)
    assert "head.weight" in m.state_dict()
