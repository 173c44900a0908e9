"""`fbt-probe bench fusion|model|nnsight|patch|probes|diff-reports`: one module per benchmark, listed
lazily by `fbt_probe.cli.COMMANDS`.

Each command builds its config, calls one library function that returns a JSON-able dict, and hands
it to `report.write_report`, which prints the Markdown or writes it to --out (with the full result as
JSON beside it, provenance included). A new benchmark is one more module doing the same, and one row
in the `bench` table.
"""
