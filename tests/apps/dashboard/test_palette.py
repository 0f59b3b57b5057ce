"""The dashboard's categorical colours stay apart for colour-blind users.

The colours are read from the stylesheet itself (its custom properties), simulated for protanopia,
deuteranopia and tritanopia with the full-severity matrices of Machado, Oliveira & Fernandes (2009,
"A physiologically-based model for simulation of color vision deficiency", applied in linear RGB),
and compared in CIELAB (CIE76 ΔE). Colours that sit side by side in one legend must differ by at least
MIN_DELTA_E under every simulation; 10 is a difference anyone sees at a glance on a swatch.
"""

from __future__ import annotations

import itertools
import re
from pathlib import Path

import pytest

CSS = Path(__file__).resolve().parents[3] / "frontend" / "static" / "dashboard" / "dashboard.css"
MIN_DELTA_E = 10.0
GROUPS = {
    "quota bar": ["within", "borrowed"],
    "compute units": ["unit-whole", "unit-mig", "unit-mps", "unit-timeslice"],
    "chart lines": ["line-1", "line-2", "line-3", "line-4", "line-5"],
}

Matrix = tuple[tuple[float, float, float], ...]
Rgb = tuple[float, float, float]
# Linear-RGB simulation matrices.
SIMULATIONS: dict[str, Matrix] = {
    "protanopia": (
        (0.152286, 1.052583, -0.204868),
        (0.114503, 0.786281, 0.099216),
        (-0.003882, -0.048116, 1.051998),
    ),
    "deuteranopia": (
        (0.367322, 0.860646, -0.227968),
        (0.280085, 0.672501, 0.047413),
        (-0.011820, 0.042940, 0.968881),
    ),
    "tritanopia": (
        (1.255528, -0.076749, -0.178779),
        (-0.078411, 0.930809, 0.147602),
        (0.004733, 0.691367, 0.303900),
    ),
    "normal": ((1, 0, 0), (0, 1, 0), (0, 0, 1)),
}


def css_colours() -> dict[str, str]:
    return dict(re.findall(r"--([a-z0-9-]+):\s*(#[0-9a-fA-F]{6})\s*;", CSS.read_text()))


def to_linear(hex_colour: str) -> tuple[float, float, float]:
    channels = [int(hex_colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
    return lin[0], lin[1], lin[2]


def to_lab(rgb: tuple[float, float, float]) -> tuple[float, float, float]:
    r, g, b = (min(1.0, max(0.0, c)) for c in rgb)
    x = (0.4124 * r + 0.3576 * g + 0.1805 * b) / 0.95047
    y = 0.2126 * r + 0.7152 * g + 0.0722 * b
    z = (0.0193 * r + 0.1192 * g + 0.9505 * b) / 1.08883

    def f(t: float) -> float:
        return t ** (1 / 3) if t > 216 / 24389 else (24389 / 27 * t + 16) / 116

    return 116 * f(y) - 16, 500 * (f(x) - f(y)), 200 * (f(y) - f(z))


def simulate(rgb: Rgb, matrix: Matrix) -> Rgb:
    r, g, b = rgb
    row = [m[0] * r + m[1] * g + m[2] * b for m in matrix]
    return row[0], row[1], row[2]


def delta_e(a: tuple[float, float, float], b: tuple[float, float, float]) -> float:
    return sum((p - q) ** 2 for p, q in zip(a, b, strict=True)) ** 0.5


@pytest.mark.parametrize("vision", sorted(SIMULATIONS))
@pytest.mark.parametrize("group", sorted(GROUPS))
def test_legend_colours_stay_apart(vision: str, group: str) -> None:
    colours = css_colours()
    names = GROUPS[group]
    assert all(n in colours for n in names), f"the stylesheet lost one of {names}"
    labs = {n: to_lab(simulate(to_linear(colours[n]), SIMULATIONS[vision])) for n in names}
    close = [
        (a, b, round(delta_e(labs[a], labs[b]), 1))
        for a, b in itertools.combinations(names, 2)
        if delta_e(labs[a], labs[b]) < MIN_DELTA_E
    ]
    assert not close, f"{group} colours too close for {vision}: {close}"


def test_the_check_fails_for_a_red_green_pair() -> None:
    # The classic pair a deuteranope confuses: the check must see it, or it proves nothing.
    red, green = to_linear("#d62728"), to_linear("#2ca02c")
    m = SIMULATIONS["deuteranopia"]
    assert delta_e(to_lab(simulate(red, m)), to_lab(simulate(green, m))) < MIN_DELTA_E
    assert delta_e(to_lab(red), to_lab(green)) > 3 * MIN_DELTA_E
