"""Options several commands share, declared once (same flag, same help)."""

from __future__ import annotations

from typing import Annotated

import typer

NBootOption = Annotated[int, typer.Option(help="Bootstrap resamples over pairs.")]
DeviceOption = Annotated[str, typer.Option(help="Device to run the model on.")]
