"""Shared pytest setup: hypothesis profiles and the --device option.

Profiles (see DESIGN.md, "Hypothesis"):
    dev   default: 100 examples, a deadline generous enough for a noisy 2-core machine;
    ci    selected automatically when the CI environment variable is set: derandomized, no deadline;
    fuzz  tens of thousands of examples, no deadline: pytest parity/ --hypothesis-profile=fuzz
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile("dev", max_examples=100, deadline=None)
settings.register_profile(
    "ci",
    max_examples=100,
    deadline=None,
    derandomize=True,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile(
    "fuzz",
    max_examples=20_000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--device",
        action="store",
        default="cpu",
        choices=("cpu", "cuda"),
        help="device for the torch side of the tests (default: cpu)",
    )


def _scale_explicit_budgets(items: list[pytest.Item]) -> None:
    """Under a profile with more than 100 examples (fuzz), scale each test's own
    @settings(max_examples=n) by the same factor, so an expensive test that budgets 15
    examples gets 15 * factor instead of staying at 15 (explicit settings otherwise win
    over the profile). hypothesis reads this attribute when the test runs."""
    factor = settings.default.max_examples / 100
    if factor <= 1:
        return
    done: set[int] = set()
    for item in items:
        fn = getattr(item, "obj", None)
        own = getattr(fn, "_hypothesis_internal_use_settings", None)
        if own is None or id(fn) in done:
            continue
        done.add(id(fn))
        fn._hypothesis_internal_use_settings = settings(
            own, max_examples=int(own.max_examples * factor), deadline=None)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _scale_explicit_budgets(items)
    if config.getoption("--device") != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="--device cuda given but torch.cuda.is_available() is False")
        for item in items:
            if "device" in getattr(item, "fixturenames", ()):
                item.add_marker(skip)


@pytest.fixture(scope="session")
def device(request: pytest.FixtureRequest) -> str:
    """The torch device the test runs on: the --device option ("cpu" unless told otherwise)."""
    return request.config.getoption("--device")


@pytest.fixture
def cuda_device() -> str:
    """For tests marked cuda: a CUDA device, or a skip that says why there is none."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device: torch.cuda.is_available() is False")
    return "cuda"
