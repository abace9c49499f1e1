"""FedAvg (McMahan et al. 2017): sample-size weighted averaging; the base strategy as is."""

from strategies.base import FLStrategy


class FedAvgStrategy(FLStrategy):
    """x_{t+1} = sum_k n_k x_k / sum_k n_k over the clients that returned a valid update."""
