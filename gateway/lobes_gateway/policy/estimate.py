"""A quantity the gateway learns online from what it measures: rates, lengths, times."""

from __future__ import annotations


class Estimate:
    """An exponentially weighted moving average of samples, seeded by a prior (None: no
    value until the first sample).

    With measured_replaces_prior, the first sample replaces the prior outright: a prior is
    a declaration, a sample is a measurement, and an average from a far-off prior would keep
    a replica priced wrong for many requests it may never be given.
    """

    __slots__ = ("_replaces_prior", "_smoothing", "samples", "value")

    def __init__(self, prior: float | None, smoothing: float,
                 measured_replaces_prior: bool = False) -> None:
        self.value = prior
        self.samples = 0
        self._smoothing = smoothing
        self._replaces_prior = measured_replaces_prior

    def observe(self, sample: float) -> None:
        if self.value is None or (self._replaces_prior and self.samples == 0):
            self.value = sample
        else:
            self.value += self._smoothing * (sample - self.value)
        self.samples += 1
