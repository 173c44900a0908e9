"""Options several commands share, declared once (same flag, same help)."""

from __future__ import annotations

from typing import Annotated

import typer

NBootOption = Annotated[int, typer.Option(help="Group-bootstrap resamples (pair groups) of the continuous means.")]
DeviceOption = Annotated[str, typer.Option(help="Device to run the model on.")]
