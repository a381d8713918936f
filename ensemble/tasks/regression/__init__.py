"""Gaussian regression: members predict (mean, std); mixture aggregators, Gaussian NLL, CRPS, interval coverage."""
