"""fedsim: a simulator of federated learning on heterogeneous device fleets."""

__version__ = "0.1.0"
