"""The library's names for named arrays, each defined once (issue round-pipeline: ``Params`` and ``Arrays`` were
defined 13 times, with two meanings)."""

from __future__ import annotations

from collections import OrderedDict
from typing import Mapping, TypeAlias

import numpy as np
import torch

Params: TypeAlias = "OrderedDict[str, np.ndarray]"
"""A model's state as a message carries it: arrays keyed by state-dict name, in the model's order
(flcore/records.py converts it to and from an ArrayRecord)."""

Arrays: TypeAlias = Mapping[str, np.ndarray]
"""Named arrays that are only read (an update, a server state): any mapping, order not relied on."""

Tensors: TypeAlias = "OrderedDict[str, torch.Tensor]"
"""Per-parameter tensors keyed by the state-dict names of a model's trainable parameters, in
``named_parameters()`` order (client_app/trainers/param_tensors.py)."""
