"""Benchmarks behind `fbt-probe bench`: each module returns a JSON-able result and renders it as Markdown."""
