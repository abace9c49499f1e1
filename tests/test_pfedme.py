"""pFedMe (T. Dinh et al., NeurIPS 2020, issue 41): the inner and local steps by hand, one whole client round with
K = 1 and beta = 1 against a hand computation (reply w, stored and evaluated theta), the server's beta-mixing,
theta-init = personal, the run checks, and that it learns beside FedAvg."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from flwr.app import RecordDict

from client_app.state import ClientState
from client_app.trainers.pfedme import PFedMeTrainer, local_step, theta_step
from flcore.config import ConfigError
from flcore.methods.pfedme import STATE_THETA
from strategies.aggregation import weighted_average
from strategies.methods.pfedme import PFedMeStrategy, beta_mix
from tests._baselines_util import initial_params, make_cfg, make_data, make_job, register, run_round


def test_inner_and_local_steps_by_hand():
    theta, w, g = torch.tensor([1.0, 2.0]), torch.tensor([0.0, 4.0]), torch.tensor([0.5, -1.0])
    # theta - 0.1 (g + 2 (theta - w) + 0.5 theta) = [1, 2] - 0.1 ([0.5, -1] + [2, -4] + [0.5, 1]) = [0.7, 2.4]
    torch.testing.assert_close(theta_step(theta.clone(), g, w, 0.1, 2.0, 0.5), torch.tensor([0.7, 2.4]))
    # w - 0.05 * 2 (w - theta) = [0, 4] - 0.1 ([-1, 2]) = [0.1, 3.8]
    torch.testing.assert_close(local_step(w.clone(), theta, 0.05, 2.0), torch.tensor([0.1, 3.8]))


def test_beta_mix_by_hand():
    x, mean = {"w": np.array([1.0, 3.0], np.float32)}, {"w": np.array([3.0, 1.0], np.float32)}
    np.testing.assert_allclose(beta_mix(x, mean, 0.25)["w"], [1.5, 2.5])        # (1 - b) x + b mean
    assert beta_mix(x, mean, 1.0)["w"] is mean["w"]                              # FedAvg's mean itself


def _cfg(**extra):
    return make_cfg(method="pfedme", batch_size=24, max_local_steps=1, **{"pfedme.k-steps": 1, "pfedme.lamda": 2.0,
                                                                          "pfedme.personal-lr": 0.3, **extra})


def test_one_inner_step_and_beta_one_by_hand():
    """K = 1, one full-batch local round from x: theta_1 = x - eta_p (grad f(x) + mu x) (theta starts at w = x),
    w_1 = x - eta lambda (x - theta_1). The reply is w_1, the stored and P-FL model theta_1; with beta = 1 the
    server's new model is the sample-weighted mean of the w_1."""
    cfg = _cfg()
    mu, eta, lam, eta_p = cfg.weight_decay, cfg.lr, 2.0, 0.3
    assert mu == 0.001 and cfg.momentum == 0.0                      # the recipe
    data = make_data(0, n=24)
    params = initial_params(cfg)
    ref = make_job(cfg, 0, 1, params, data, RecordDict()).model
    F.cross_entropy(ref(data.x_train), data.y_train).backward()
    job = make_job(cfg, 0, 1, params, data, RecordDict())
    trainer = PFedMeTrainer(job)
    reply = trainer.run()
    stored = job.state.get_arrays(STATE_THETA)
    for name, p in ref.named_parameters():
        x = torch.from_numpy(params[name])
        theta = x - eta_p * (p.grad + mu * x)
        w = x - eta * lam * (x - theta)
        torch.testing.assert_close(torch.from_numpy(stored[name]), theta, rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(dict(trainer.personalized().named_parameters())[name].detach(), theta,
                                   rtol=1e-5, atol=1e-7)
        torch.testing.assert_close(torch.from_numpy(np.asarray(reply.params[name])), w, rtol=1e-5, atol=1e-7)
    assert reply.metrics["local-steps"] == 1


def test_server_round_with_beta():
    cfg = make_cfg(method="pfedme", **{"pfedme.beta": 0.5})
    datas = {cid: make_data(cid) for cid in range(3)}
    strategy = PFedMeStrategy(cfg)
    register(strategy, datas)
    params = initial_params(cfg)
    new, updates = run_round(cfg, strategy, 1, params, datas, {c: RecordDict() for c in datas}, [0, 1, 2])
    mean = weighted_average([u.params for u in updates], [u.num_examples for u in updates])
    for k in params:
        np.testing.assert_allclose(new[k], 0.5 * params[k] + 0.5 * mean[k], rtol=1e-6, atol=1e-7)


def test_theta_init_personal_starts_from_the_stored_theta():
    cfg = _cfg(**{"pfedme.theta-init": "personal"})
    data = make_data(1, n=24)
    params = initial_params(cfg)
    state = RecordDict()
    first = make_job(cfg, 0, 1, params, data, state)
    PFedMeTrainer(first).fit()
    theta1 = first.state.get_arrays(STATE_THETA)
    # round 2 from the same global model: "personal" continues from theta_1, "global" starts again at x
    runs = {}
    for init in ("personal", "global"):
        c = _cfg(**{"pfedme.theta-init": init})
        job = make_job(c, 0, 2, params, data, state if init == "personal" else RecordDict())
        if init == "global":
            job.state.put_arrays(STATE_THETA, theta1)
        PFedMeTrainer(job).fit()
        runs[init] = job.state.get_arrays(STATE_THETA)
    again = make_job(cfg, 0, 1, params, data, RecordDict())
    PFedMeTrainer(again).fit()
    k = next(iter(theta1))
    np.testing.assert_allclose(runs["global"][k], again.state.get_arrays(STATE_THETA)[k], rtol=1e-6)
    assert not np.allclose(runs["personal"][k], runs["global"][k])
    assert isinstance(first.state, ClientState)


def test_run_checks_name_the_key():
    with pytest.raises(ConfigError, match="'momentum' must be 0"):
        make_cfg(method="pfedme", momentum=0.9)
    with pytest.raises(ConfigError, match="lr \\* pfedme.lamda = 3 >= 2"):
        make_cfg(method="pfedme", lr=0.2)


@pytest.mark.slow
def test_it_learns_beside_fedavg(tmp_path):
    """digits, 10 clients, Dirichlet(0.1), 15 rounds, lr 0.05, no momentum: pFedMe's personalized models (P-FL)
    are at least as good as FedAvg's local models less 0.03 and its global model within 0.1 of FedAvg's
    (tests/_learning_util.py; measured 2026-12-01, means of the last 3 rounds: G-FL / P-FL FedAvg 0.808 / 0.879,
    pFedMe 0.851 / 0.907)."""
    from tests._learning_util import fedavg_doc, final, run
    fedavg, pfedme = fedavg_doc(), run(tmp_path, "pfedme")
    assert final(pfedme, "local_accuracy") >= final(fedavg, "local_accuracy") - 0.03
    assert final(pfedme, "global_accuracy") >= final(fedavg, "global_accuracy") - 0.1
    assert final(pfedme, "global_accuracy") > 0.6
