"""The study's parts, in the order the report reads them (findings, then sections). Each module
holds one `PART` (`fbt_probe.reproduce.part.Part`); a new part is one module and one line here."""

from fbt_probe.reproduce.parts import (
    contraction,
    data,
    depth,
    evaluation,
    interventions,
    methods,
    paired,
    passes,
    probes,
    sae,
    training,
)

PARTS = [
    data.PART,
    evaluation.PART,
    contraction.PART,
    passes.PART,
    probes.PART,
    interventions.PART,
    paired.PART,
    methods.PART,
    sae.PART,
    depth.PART,
    training.PART,
]
