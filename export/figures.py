"""Pictures a model version keeps: a plot of its positional encodings, drawn here, and PNGs of the
training run (its curves), copied. Each is a file of the version folder, so the manifest pins it.
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from export.model import sinusoidal_table
from export.validate import ExportError
from service.contract.manifest import FIGURE_NAME

POSITIONS = "positions"
CURVE_DIMS = (0.1, 0.2, 0.35, 0.5)  # dimensions drawn as curves, as fractions of d_model


def plot_positions(max_len: int, d_model: int, path: Path) -> None:
    """Heatmap position x dimension of the sinusoidal table, and a few dimensions along the positions:
    every dimension pair is a sine/cosine of its own wavelength, which lets attention read offsets."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    table = sinusoidal_table(max_len, d_model).numpy()  # (max_len, D)
    fig, (heat, lines) = plt.subplots(1, 2, figsize=(11, 3.6), gridspec_kw={"width_ratios": [1.25, 1]})
    image = heat.imshow(table, aspect="auto", cmap="RdBu_r", vmin=-1, vmax=1, interpolation="nearest")
    heat.set_title(f"sinusoidal positional encoding ({max_len} positions x {d_model} dimensions)", fontsize=10)
    heat.set_xlabel("dimension (even: sin, odd: cos)")
    heat.set_ylabel("position")
    fig.colorbar(image, ax=heat, fraction=0.04)
    for d in sorted({2 * int(f * d_model / 2) for f in CURVE_DIMS}):
        wavelength = 2 * np.pi * 10000 ** (d / d_model)  # positions per turn
        lines.plot(table[:, d], label=f"dim {d} (λ≈{wavelength:.0f})")
    lines.set_title("sine dimensions along the positions: each its own wavelength", fontsize=10)
    lines.set_xlabel("position")
    lines.set_ylim(-1.1, 1.1)
    lines.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.0, 0.5))
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)


def check_extra(paths: Sequence[Path]) -> None:
    """Extra figures are PNG files with distinct, plain names: checked before the long export starts."""
    names = [POSITIONS]
    for path in paths:
        if path.suffix != ".png" or not path.is_file():
            raise ExportError(f"figure {path} is not a PNG file")
        if not FIGURE_NAME.match(path.stem):
            raise ExportError(f"figure {path.name}: name it with lower-case letters, digits, '-' or '_'")
        if path.stem in names:
            raise ExportError(f"figure {path.name}: a figure named {path.stem!r} is already in the version")
        names.append(path.stem)


def write_figures(folder: Path, max_len: int, d_model: int, extra: Sequence[Path] = ()) -> dict[str, str]:
    """Draws the positional encodings and copies `extra` into `folder`; figure name -> file name."""
    check_extra(extra)
    out = {POSITIONS: f"{POSITIONS}.png"}
    plot_positions(max_len, d_model, folder / out[POSITIONS])
    for path in extra:
        if (folder / path.name).exists():
            raise ExportError(f"figure {path.name} would replace a file of the version")
        shutil.copyfile(path, folder / path.name)
        out[path.stem] = path.name
    return out
